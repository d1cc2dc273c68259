//! The Secrets Store CSI driver on the real node: the driver built unchanged from its module, with our
//! kubelet registrar and test provider (`e2e/companions/secrets-store-csi`), run as host processes in
//! the node's network namespace and the machine's mount namespace (the kubelet's), over the driver's
//! own CRDs and CSIDriver object. The test provider mounts the files of a directory the test writes:
//! a SecretProviderClass's parameter `directory` names it, and an object's version is the first 16 hex
//! digits of the SHA-256 of its file, so a test rotates a secret by writing its file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::companions::{bin_dir, HostProcess};
use crate::node::kubectl;
use crate::{wait_for, TIMEOUT};

pub const DRIVER: &str = "secrets-store.csi.k8s.io";
/// The provider name a SecretProviderClass gives to reach the test provider.
pub const PROVIDER: &str = "rekindle-e2e";
const NODE: &str = "rekindle-node";
pub const CRDS: [&str; 2] = [
    "secretproviderclasses.secrets-store.csi.x-k8s.io",
    "secretproviderclasspodstatuses.secrets-store.csi.x-k8s.io",
];
/// How often the driver asks the provider again when the kubelet republishes a volume.
pub const ROTATION_POLL: Duration = Duration::from_secs(2);

/// The driver's own CRDs (SecretProviderClass, SecretProviderClassPodStatus) as one YAML stream, taken
/// from its module without building anything: what the tests that write statuses by hand install.
pub fn crds() -> Result<String> {
    let path = bin_dir("csi-crds")?.join("crds/secrets-store.csi.x-k8s.io.yaml");
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// The SecretProviderClassPodStatus API of `namespace`, once the apiserver serves the CRD (installed
/// from [`crds`] just before, it is not served at once).
pub async fn status_api(
    client: &kube::Client,
    namespace: &str,
) -> Result<kube::Api<kube::api::DynamicObject>> {
    wait_for("the status CRD to be served", TIMEOUT, || async {
        let kind = "SecretProviderClassPodStatus";
        let api = crate::dynamic_api(
            client,
            "secrets-store.csi.x-k8s.io/v1",
            kind,
            Some(namespace),
        );
        Ok(api.await.ok())
    })
    .await
}

/// The driver, its registrar and the test provider; stopped on drop, and the CSIDriver and CRDs removed
/// (a later test sees a cluster without the driver).
pub struct SecretsStoreCsi {
    provider: HostProcess,
    driver: HostProcess,
    registrar: HostProcess,
    registration_socket: PathBuf,
    secrets: PathBuf,
    _dir: tempfile::TempDir,
}

impl SecretsStoreCsi {
    pub async fn start() -> Result<Self> {
        let bin = bin_dir("csi")?;
        for manifest in [
            "crds/secrets-store.csi.x-k8s.io.yaml",
            "crds/csidriver.yaml",
        ] {
            kubectl(&[
                "apply",
                "--server-side",
                "-f",
                &bin.join(manifest).to_string_lossy(),
            ])?;
        }
        for crd in CRDS {
            crate::wait_for(&format!("CRD {crd} established"), TIMEOUT, || async {
                let status = kubectl(&[
                    "get",
                    "crd",
                    crd,
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#,
                ])?;
                Ok((status.trim() == "True").then_some(()))
            })
            .await?;
        }
        let kubelet_root =
            PathBuf::from(std::env::var("REKINDLE_KUBELET_ROOT").context(
                "REKINDLE_KUBELET_ROOT is not set: run through e2e/scripts/node.sh exec",
            )?);
        let dir = tempfile::tempdir()?;
        let secrets = dir.path().join("secrets");
        let providers = dir.path().join("providers");
        std::fs::create_dir_all(&secrets)?;
        std::fs::create_dir_all(&providers)?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let tool = bin.join("secrets-store-csi-e2e");
        let provider = HostProcess::start(
            &tool,
            &[
                "provider",
                "--socket",
                &path(&providers.join(format!("{PROVIDER}.sock"))),
                "--root",
                &path(&secrets),
            ],
            dir.path().join("provider.log"),
        )?;
        let driver_socket = kubelet_root.join("plugins/csi-secrets-store/csi.sock");
        std::fs::create_dir_all(driver_socket.parent().expect("a parent"))?;
        let _ = std::fs::remove_file(&driver_socket);
        let [metrics] = crate::rekindle::free_ports()?;
        let driver = HostProcess::start(
            &bin.join("secrets-store-csi-driver"),
            &[
                &format!("--endpoint=unix://{}", path(&driver_socket)),
                &format!("--nodeid={NODE}"),
                &format!("--provider-volume={}", path(&providers)),
                &format!("--additional-provider-volume-paths={}", path(&providers)),
                &format!("--metrics-addr=127.0.0.1:{metrics}"),
                "--enable-secret-rotation",
                &format!("--rotation-poll-interval={}s", ROTATION_POLL.as_secs()),
                "-v=2",
            ],
            dir.path().join("driver.log"),
        )?;
        wait_for("the driver's CSI socket", TIMEOUT, || async {
            Ok(driver_socket.exists().then_some(()))
        })
        .await
        .with_context(|| driver.log_tail())?;
        let registration_socket = kubelet_root.join(format!("plugins_registry/{DRIVER}-reg.sock"));
        let registrar = HostProcess::start(
            &tool,
            &[
                "registrar",
                "--socket",
                &path(&registration_socket),
                "--driver-name",
                DRIVER,
                "--driver-socket",
                &path(&driver_socket),
            ],
            dir.path().join("registrar.log"),
        )?;
        let csi = Self {
            provider,
            driver,
            registrar,
            registration_socket,
            secrets,
            _dir: dir,
        };
        wait_for(
            "the kubelet to register the driver (CSINode)",
            TIMEOUT,
            || async {
                let drivers = kubectl(&[
                    "get",
                    "csinode",
                    NODE,
                    "-o",
                    "jsonpath={.spec.drivers[*].name}",
                ])
                .unwrap_or_default();
                Ok(drivers
                    .split_whitespace()
                    .any(|d| d == DRIVER)
                    .then_some(()))
            },
        )
        .await
        .with_context(|| csi.logs())?;
        Ok(csi)
    }

    /// Writes (or rotates) the secret `name` that SecretProviderClasses with `directory: dir` mount;
    /// its object id (`dir/name`) and version as the provider reports them.
    pub fn write_secret(&self, dir: &str, name: &str, value: &str) -> Result<(String, String)> {
        let d = self.secrets.join(dir);
        std::fs::create_dir_all(&d)?;
        let tmp = d.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, value)?;
        std::fs::rename(&tmp, d.join(name))?;
        Ok((format!("{dir}/{name}"), object_version(value.as_bytes())))
    }

    /// The last lines of each process's log, for a failing test's message.
    pub fn logs(&self) -> String {
        format!(
            "--- secrets-store-csi-driver ---\n{}\n--- registrar ---\n{}\n--- test provider ---\n{}",
            self.driver.log_tail(),
            self.registrar.log_tail(),
            self.provider.log_tail()
        )
    }
}

/// The version the test provider gives an object: the first 16 hex digits of its content's SHA-256.
pub fn object_version(content: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, content);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Drop for SecretsStoreCsi {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.registration_socket);
        let _ = kubectl(&["delete", "csidriver", DRIVER, "--ignore-not-found"]);
        let mut args = vec!["delete", "crd", "--ignore-not-found", "--wait=true"];
        args.extend(CRDS);
        let _ = kubectl(&args);
    }
}
