//! Env-var names, byte-for-byte as Reloader builds them (behaviour §3).

use super::ResourceKind;

/// Every marker env var starts with this.
pub const ENV_PREFIX: &str = "STAKATER_";

/// `STAKATER_<CONVERTED NAME>_<TYPE>`.
pub fn env_var_name(resource_name: &str, kind: ResourceKind) -> String {
    let mut out = String::with_capacity(9 + resource_name.len() + 20);
    out.push_str(ENV_PREFIX);
    out.push_str(&convert(resource_name));
    out.push('_');
    out.push_str(kind.env_suffix());
    out
}

/// Upper-cases and replaces every run of bytes outside `[A-Z0-9]` by one `_`, dropping leading junk.
/// Walks bytes, not chars, as Reloader does: a multi-byte character is one run of junk.
pub fn convert(name: &str) -> String {
    let upper = go_to_upper(name);
    let mut out = String::with_capacity(upper.len());
    let mut last_valid = false;
    for b in upper.bytes() {
        if b.is_ascii_uppercase() || b.is_ascii_digit() {
            out.push(b as char);
            last_valid = true;
        } else if last_valid {
            out.push('_');
            last_valid = false;
        }
    }
    out
}

/// Go's `strings.ToUpper` uses simple (one-to-one) case mapping: `ß` stays `ß` where Rust's full
/// mapping would give `SS`, which would change the name.
fn go_to_upper(s: &str) -> String {
    s.chars()
        .map(|c| {
            let mut up = c.to_uppercase();
            match (up.next(), up.next()) {
                (Some(u), None) => u,
                _ => c,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        for (input, want) in [
            ("my.app.config", "MY_APP_CONFIG"),
            ("a--b", "A_B"),
            ("-x", "X"),
            ("my_config", "MY_CONFIG"),
            ("app-", "APP_"),
            ("Ünïcode-1", "N_CODE_1"),
            ("straße", "STRA_E"),
            ("ıd", "ID"),
            ("", ""),
        ] {
            assert_eq!(convert(input), want, "convert({input:?})");
        }
    }

    /// docs/behaviour.md §3's examples.
    #[test]
    fn the_documented_examples_hold() {
        let rows = crate::core::behaviour_doc::table("3.");
        assert!(!rows.is_empty());
        for row in rows {
            assert_eq!(convert(&row[0]), row[1], "{row:?}");
        }
    }

    #[test]
    fn full_names() {
        assert_eq!(
            env_var_name("my.app.config", ResourceKind::ConfigMap),
            "STAKATER_MY_APP_CONFIG_CONFIGMAP"
        );
        assert_eq!(
            env_var_name("db-creds", ResourceKind::Secret),
            "STAKATER_DB_CREDS_SECRET"
        );
        assert_eq!(
            env_var_name("vault", ResourceKind::SecretProviderClass),
            "STAKATER_VAULT_SECRETPROVIDERCLASS"
        );
    }
}
