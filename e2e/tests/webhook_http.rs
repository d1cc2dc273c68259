//! The webhook's HTTP surface against a running rekindle, from a separate process (curl): refusals
//! with the right status, and other clients still served.

use std::process::Command;

use anyhow::Result;
use e2e::rekindle::{Options, Rekindle};
use e2e::{admin_client, state_dir, TestNamespace};

/// POSTs `body` (from a file) with `content_type`; returns the HTTP status, or None when curl failed.
fn post(port: u16, content_type: &str, body: &[u8], extra: &[&str]) -> Result<Option<u16>> {
    let file = state_dir().join(format!("body-{port}-{}.bin", body.len()));
    std::fs::write(&file, body)?;
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(state_dir().join("pki/ca.crt"))
        .args([
            "-H",
            &format!("Content-Type: {content_type}"),
            "--data-binary",
        ])
        .arg(format!("@{}", file.display()))
        .args(extra)
        .arg(format!("https://127.0.0.1:{port}/mutate"))
        .output()?;
    let _ = std::fs::remove_file(&file);
    let code: u16 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    // A server that refuses a large body early may reset the upload: the status still counts.
    Ok((code != 0).then_some(code))
}

const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},"namespace":"x","name":"d","operation":"CREATE","userInfo":{"username":"u"},"object":{"metadata":{"name":"d"},"spec":{"template":{"spec":{"containers":[]}}}}}}"#;

#[tokio::test]
async fn bad_requests_get_the_right_refusal_and_good_ones_are_served() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-http").await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let port = rk.webhook_port;
    assert_eq!(
        post(port, "application/json", REVIEW.as_bytes(), &[])?,
        Some(200)
    );
    assert_eq!(
        post(port, "text/plain", REVIEW.as_bytes(), &[])?,
        Some(415),
        "wrong content type"
    );
    assert_eq!(
        post(port, "application/json", b"{not json", &[])?,
        Some(400),
        "malformed JSON"
    );
    assert_eq!(
        post(
            port,
            "application/json",
            b"{\"kind\":\"AdmissionReview\"}",
            &[]
        )?,
        Some(400),
        "wrong shape"
    );
    let huge = vec![b' '; 8 * 1024 * 1024];
    assert_eq!(
        post(port, "application/json", &huge, &["--http1.1"])?,
        Some(413),
        "body over 7 MiB"
    );
    // TLS 1.2 is refused by default (TLS 1.3 only); plain HTTP on the TLS port gets no answer.
    assert_eq!(
        post(
            port,
            "application/json",
            REVIEW.as_bytes(),
            &["--tls-max", "1.2"]
        )?,
        None,
        "TLS 1.2 refused"
    );
    let plain = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg(format!("http://127.0.0.1:{port}/mutate"))
        .output()?;
    assert_ne!(
        String::from_utf8_lossy(&plain.stdout).trim(),
        "200",
        "plain HTTP is not served"
    );
    // Other clients keep being served.
    assert_eq!(
        post(port, "application/json", REVIEW.as_bytes(), &[])?,
        Some(200)
    );
    rk.stop().await?;
    ns.cleanup().await
}

fn abuse(args: &[&str]) -> Result<String> {
    let out = Command::new(e2e::root().join("e2e/scripts/abuse.py"))
        .args(args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "abuse.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

#[tokio::test]
async fn misbehaving_clients_are_cut_off_and_others_keep_being_served() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "e2e-abuse").await?;
    let rk = Rekindle::start(&client, &[&ns.name], Options::default()).await?;
    let port = rk.webhook_port.to_string();
    let rss_before = rk.rss_bytes().unwrap_or(0);

    // Slow headers and an idle connection flood, in the background.
    let slow = {
        let port = port.clone();
        std::thread::spawn(move || abuse(&["slow-headers", &port]))
    };
    let flood = {
        let port = port.clone();
        std::thread::spawn(move || abuse(&["flood", &port, "300", "14"]))
    };
    let random = abuse(&["random", &port])?;
    assert!(
        random == "tls-alert" || random == "closed",
        "random bytes get a TLS alert at most: {random}"
    );
    for version in ["1.0", "1.1"] {
        assert_eq!(
            abuse(&["old-tls", &port, version])?,
            "refused",
            "TLS {version}"
        );
    }
    // Meanwhile, real requests keep being answered.
    for _ in 0..20 {
        assert_eq!(
            post(rk.webhook_port, "application/json", REVIEW.as_bytes(), &[])?,
            Some(200)
        );
    }
    let slow_secs: f64 = slow.join().expect("slow thread")?.parse()?;
    assert!(
        slow_secs < 30.0,
        "a client that never finishes its headers is cut off by the header timeout (took {slow_secs} s)"
    );
    let flood = flood.join().expect("flood thread")?;
    let (opened, closed) = flood.split_once(' ').unwrap_or(("0", "0"));
    assert_eq!(opened, "300", "all connections were accepted");
    assert_eq!(
        closed, "300",
        "connections that never start TLS are closed by the handshake timeout"
    );
    assert_eq!(
        post(rk.webhook_port, "application/json", REVIEW.as_bytes(), &[])?,
        Some(200)
    );
    let rss_after = rk.rss_bytes().unwrap_or(0);
    assert!(
        rss_after < rss_before + 32 * 1024 * 1024,
        "memory stays bounded: {rss_before} -> {rss_after} bytes"
    );
    rk.stop().await?;
    ns.cleanup().await
}
