//! Job re-creation that survives a crash. A Job is reloaded by deleting it and creating it again under
//! the same name; between the two, the Job exists nowhere, and a leader that dies there would lose it
//! (no other replica knows it was owed). So before the delete, the leader records the Job to create in
//! a ConfigMap of its own namespace (`rekindle-recreate-<old UID>`, labelled [`RECORD_LABEL`]); once the
//! new Job exists, the record is removed. A replica that begins to lead finishes every record left
//! behind ([`leftover`] says how).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

/// The label of every record (value `job`); a new leader lists by it.
pub const RECORD_LABEL: &str = "rekindle.io/recreate";

/// One Job to create again, as recorded before its predecessor was deleted.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The namespace and name of the Job.
    pub namespace: String,
    pub name: String,
    /// The UID of the Job that was (or is about to be) deleted.
    pub old_uid: String,
    /// The Job to create, as the reload planned it.
    pub job: Value,
}

impl Record {
    /// The ConfigMap that holds the record, named after the old Job's UID.
    pub fn to_configmap(&self) -> ConfigMap {
        let data = BTreeMap::from([
            ("namespace".to_string(), self.namespace.clone()),
            ("name".to_string(), self.name.clone()),
            ("uid".to_string(), self.old_uid.clone()),
            ("job".to_string(), self.job.to_string()),
        ]);
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(record_name(&self.old_uid)),
                labels: Some(BTreeMap::from([(RECORD_LABEL.into(), "job".into())])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    /// The record a ConfigMap holds; why not, if it holds none.
    pub fn from_configmap(cm: &ConfigMap) -> Result<Record, String> {
        let data = cm.data.as_ref().ok_or("no data")?;
        let field = |k: &str| {
            data.get(k)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| format!("no {k}"))
        };
        let job: Value = serde_json::from_str(&field("job")?).map_err(|e| format!("job: {e}"))?;
        if !job.is_object() {
            return Err("job: not an object".into());
        }
        Ok(Record {
            namespace: field("namespace")?,
            name: field("name")?,
            old_uid: field("uid")?,
            job,
        })
    }
}

fn record_name(old_uid: &str) -> String {
    format!("rekindle-recreate-{old_uid}")
}

/// What a record left behind asks of the next leader, given the Job under its name now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// The old Job was never deleted: it is reloaded as any other (its markers are stale), and the
    /// record goes.
    NotDeleted,
    /// Another Job has the name: the re-create was made; the record goes.
    Created,
    /// No Job, or the old one on its way out: create the recorded one, then the record goes.
    Create,
}

/// `current`: the UID of the Job under the record's name and whether it is being deleted.
pub fn leftover(record: &Record, current: Option<(&str, bool)>) -> Leftover {
    match current {
        None => Leftover::Create,
        Some((uid, terminating)) if uid == record.old_uid => {
            if terminating {
                Leftover::Create
            } else {
                Leftover::NotDeleted
            }
        }
        Some(_) => Leftover::Created,
    }
}

/// The records in one namespace (the replica's own).
pub struct Records {
    api: Api<ConfigMap>,
    pub namespace: String,
}

impl Records {
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
        }
    }

    /// Writes (or overwrites) the record of one re-create.
    pub async fn write(&self, record: &Record) -> Result<(), kube::Error> {
        let params = PatchParams::apply("rekindle").force();
        // A typed object serialises with its apiVersion and kind, as server-side apply wants.
        let cm = record.to_configmap();
        self.api
            .patch(&record_name(&record.old_uid), &params, &Patch::Apply(&cm))
            .await
            .map(|_| ())
    }

    /// Removes the record of a finished re-create (already gone is fine).
    pub async fn remove(&self, old_uid: &str) -> Result<(), kube::Error> {
        match self
            .api
            .delete(&record_name(old_uid), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every record left behind, with the ConfigMaps that hold none (by name, with why).
    pub async fn list(&self) -> Result<(Vec<Record>, Vec<(String, String)>), kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().labels(RECORD_LABEL))
            .await?;
        let (mut records, mut invalid) = (Vec::new(), Vec::new());
        for cm in &list.items {
            match Record::from_configmap(cm) {
                Ok(r) => records.push(r),
                Err(why) => invalid.push((cm.metadata.name.clone().unwrap_or_default(), why)),
            }
        }
        Ok((records, invalid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record() -> Record {
        Record {
            namespace: "apps".into(),
            name: "migrate".into(),
            old_uid: "u-1".into(),
            job: json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate"}}),
        }
    }

    #[test]
    fn a_record_survives_its_configmap() {
        let cm = record().to_configmap();
        assert_eq!(cm.metadata.name.as_deref(), Some("rekindle-recreate-u-1"));
        assert_eq!(
            cm.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(RECORD_LABEL)),
            Some(&"job".to_string())
        );
        assert_eq!(Record::from_configmap(&cm), Ok(record()));
    }

    #[test]
    fn a_configmap_without_a_whole_record_says_what_is_missing() {
        let mut cm = record().to_configmap();
        cm.data.as_mut().unwrap().remove("uid");
        assert_eq!(Record::from_configmap(&cm), Err("no uid".into()));
        let mut cm = record().to_configmap();
        cm.data.as_mut().unwrap().insert("job".into(), "[1]".into());
        assert_eq!(
            Record::from_configmap(&cm),
            Err("job: not an object".into())
        );
        assert_eq!(
            Record::from_configmap(&ConfigMap::default()),
            Err("no data".into())
        );
    }

    #[test]
    fn a_leftover_is_created_only_when_the_old_job_is_gone_or_going() {
        let r = record();
        assert_eq!(leftover(&r, None), Leftover::Create);
        assert_eq!(leftover(&r, Some(("u-1", true))), Leftover::Create);
        assert_eq!(leftover(&r, Some(("u-1", false))), Leftover::NotDeleted);
        assert_eq!(leftover(&r, Some(("u-2", false))), Leftover::Created);
        assert_eq!(leftover(&r, Some(("u-2", true))), Leftover::Created);
    }
}
