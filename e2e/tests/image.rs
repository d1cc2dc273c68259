//! The image archive `just image` writes (target/image/rekindle.tar), checked against what the
//! Dockerfile's runtime stage declares: the image is assembled from the release binaries, not built by
//! a container engine, so this is what keeps the two the same. Runs with the install tests, after
//! `just image`; the install tests then run the image for real.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::Command;

use anyhow::{anyhow, ensure, Context, Result};
use e2e::root;
use serde_json::Value;

/// What the Dockerfile's last stage declares.
#[derive(Default, Debug)]
struct RuntimeStage {
    base: String,
    copies: Vec<(String, String)>,
    user: String,
    expose: Vec<String>,
    entrypoint: Value,
}

fn runtime_stage() -> Result<RuntimeStage> {
    let text = std::fs::read_to_string(root().join("Dockerfile"))?;
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .ok_or_else(|| anyhow!("the Dockerfile has no FROM"))?;
    let mut stage = RuntimeStage::default();
    for line in &lines[last_from..] {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "FROM" => stage.base = rest.split_whitespace().next().unwrap_or_default().into(),
            "COPY" => {
                let paths: Vec<&str> = rest
                    .split_whitespace()
                    .filter(|a| !a.starts_with("--"))
                    .collect();
                ensure!(
                    paths.len() == 2,
                    "unexpected COPY in the runtime stage: {line}"
                );
                let binary = paths[0].rsplit('/').next().unwrap_or_default();
                stage.copies.push((binary.into(), paths[1].into()));
            }
            "USER" => stage.user = rest.into(),
            "EXPOSE" => stage.expose.extend(rest.split_whitespace().map(|p| {
                if p.contains('/') {
                    p.to_string()
                } else {
                    format!("{p}/tcp")
                }
            })),
            "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest)?,
            other => {
                anyhow::bail!("the runtime stage has {other}, which the image builder does not map")
            }
        }
    }
    Ok(stage)
}

/// Every file of the archive by path.
fn archive() -> Result<BTreeMap<String, (u32, Vec<u8>)>> {
    let path = root().join("target/image/rekindle.tar");
    let file = std::fs::File::open(&path)
        .with_context(|| format!("{} (run `just image`)", path.display()))?;
    let mut out = BTreeMap::new();
    for entry in tar::Archive::new(file).entries()? {
        let mut entry = entry?;
        let name = entry.path()?.to_string_lossy().into_owned();
        let mode = entry.header().mode()?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        out.insert(name, (mode, data));
    }
    Ok(out)
}

fn blob<'a>(files: &'a BTreeMap<String, (u32, Vec<u8>)>, digest: &str) -> Result<&'a [u8]> {
    let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    files
        .get(&name)
        .map(|(_, d)| d.as_slice())
        .ok_or_else(|| anyhow!("no blob {name}"))
}

#[test]
fn image_matches_the_dockerfile() -> Result<()> {
    let stage = runtime_stage()?;
    ensure!(
        stage.base.starts_with("gcr.io/distroless/cc-debian12"),
        "runtime base {}",
        stage.base
    );
    let files = archive()?;

    // Named as the chart's default image.
    let index: Value = serde_json::from_slice(
        &files
            .get("index.json")
            .ok_or_else(|| anyhow!("no index.json"))?
            .1,
    )?;
    let values = std::fs::read_to_string(root().join("charts/rekindle/values.yaml"))?;
    let repository = values
        .lines()
        .find_map(|l| l.trim().strip_prefix("repository: "))
        .ok_or_else(|| anyhow!("no image.repository in values.yaml"))?;
    let chart = std::fs::read_to_string(root().join("charts/rekindle/Chart.yaml"))?;
    let app_version = chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion: "))
        .map(|v| v.trim_matches('"'))
        .ok_or_else(|| anyhow!("no appVersion in Chart.yaml"))?;
    let manifest_ref = &index["manifests"][0];
    assert_eq!(
        manifest_ref["annotations"]["io.containerd.image.name"],
        format!("{repository}:{app_version}").as_str()
    );

    // The config: user, entrypoint and ports as declared, and distroless's CA bundle variable.
    let manifest: Value = serde_json::from_slice(blob(
        &files,
        manifest_ref["digest"].as_str().unwrap_or_default(),
    )?)?;
    let config: Value = serde_json::from_slice(blob(
        &files,
        manifest["config"]["digest"].as_str().unwrap_or_default(),
    )?)?;
    let cfg = &config["config"];
    assert_eq!(cfg["User"], stage.user.as_str());
    assert_eq!(cfg["Entrypoint"], stage.entrypoint);
    let ports: Vec<&str> = cfg["ExposedPorts"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut want: Vec<&str> = stage.expose.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(ports, want);
    let env: Vec<&str> = cfg["Env"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        env.contains(&"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"),
        "{env:?}"
    );

    // The layer: the release binaries byte for byte at the declared paths, every library they load,
    // the CA bundle, and the nonroot user the Dockerfile's USER names.
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap_or_default();
    let mut layer = BTreeMap::new();
    for entry in tar::Archive::new(blob(&files, layer_digest)?).entries()? {
        let mut entry = entry?;
        let name = format!("/{}", entry.path()?.to_string_lossy());
        let mode = entry.header().mode()?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        layer.insert(name, (mode, data));
    }
    for (binary, dest) in &stage.copies {
        let release = std::fs::read(root().join("target/release").join(binary))?;
        let (mode, data) = layer
            .get(dest)
            .ok_or_else(|| anyhow!("{dest} is not in the image"))?;
        ensure!(
            *data == release,
            "{dest} differs from target/release/{binary}"
        );
        ensure!(mode & 0o111 != 0, "{dest} is not executable");
        let ldd = Command::new("ldd")
            .arg(root().join("target/release").join(binary))
            .output()?;
        for lib in String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            ensure!(
                layer.contains_key(lib),
                "{dest} needs {lib}, which the image lacks"
            );
        }
    }
    ensure!(
        layer
            .get("/etc/ssl/certs/ca-certificates.crt")
            .is_some_and(|(_, d)| d.len() > 1000),
        "no CA bundle"
    );
    let passwd = String::from_utf8_lossy(
        &layer
            .get("/etc/passwd")
            .ok_or_else(|| anyhow!("no /etc/passwd"))?
            .1,
    )
    .into_owned();
    let uid = stage.user.split(':').next().unwrap_or_default();
    ensure!(
        passwd.lines().any(|l| l.split(':').nth(2) == Some(uid)),
        "no user {uid} in /etc/passwd"
    );
    Ok(())
}
