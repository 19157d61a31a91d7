use super::*;
use switchyard_core::crypto::Secret;

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
    assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_duration("7"), Some(Duration::from_secs(7)));
    assert_eq!(parse_duration("1x"), None);
    assert_eq!(parse_duration(""), None);
}

#[test]
// figment's Jail API fixes the closure's error type.
#[allow(clippy::result_large_err)]
fn printed_default_config_is_the_default() {
    // Parsed on its own: every key is where the structs expect it (unknown keys are
    // refused, so a key printed under the wrong table fails here).
    let printed = default_config_toml();
    assert!(
        !printed.contains(PROVIDER_SECTIONS_MARK),
        "every section went in"
    );
    let parsed = extract(&Figment::from(Toml::string(&printed))).unwrap();
    assert_eq!(parsed, Config::default());
    // Loaded as a config file, the way `serve --config FILE` does.
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("printed.toml", &printed)?;
        let c = Config::load(Some(Path::new("printed.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c, Config::default());
        Ok(())
    });
    // Every top-level key that is not a table is printed before the first table, where
    // TOML puts it at the top level.
    let top = printed.split("\n[").next().unwrap();
    for key in [
        "hosts_tls_listen",
        "operator_tokens",
        "listen",
        "metrics_listen",
    ] {
        assert!(
            top.lines().any(|l| l.starts_with(&format!("{key} ="))),
            "{key} is printed at the top level"
        );
    }
}

#[test]
#[allow(clippy::result_large_err)]
fn unknown_keys_are_refused_naming_them() {
    figment::Jail::expect_with(|jail| {
        // Whatever SWITCHYARD_* the test runner has (scripts/test.sh exports some) would
        // be refused as unknown keys.
        jail.clear_env();
        jail.set_env("SWITCHYARD_LEASE__CONECTOR_GRACE", "2h");
        let e = Config::load(None).unwrap_err().to_string();
        assert!(
            e.contains("lease.conector_grace")
                && e.contains("SWITCHYARD_LEASE__CONECTOR_GRACE")
                && e.contains("connector_grace"),
            "{e}"
        );
        Ok(())
    });
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_LISTN", "0.0.0.0:1");
        let e = Config::load(None).unwrap_err().to_string();
        assert!(
            e.contains("`listn`") && e.contains("SWITCHYARD_LISTN"),
            "{e}"
        );
        Ok(())
    });
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("typo.toml", "[log]\nhosts_tls_listen = \"\"\n")?;
        let e = Config::load(Some(Path::new("typo.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("log.hosts_tls_listen") && e.contains("typo.toml"),
            "{e}"
        );
        Ok(())
    });
    // The file and log-filter variables are not keys.
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_LOG", "debug");
        jail.set_env("SWITCHYARD_LOG__LEVEL", "warn");
        let c = Config::load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.log.level, "warn");
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)]
fn every_table_refuses_unknown_keys() {
    // One typo per table, through the environment: each is refused naming its variable.
    for var in [
        "SWITCHYARD_S3__BUKET",
        "SWITCHYARD_LEASE__GRACE",
        "SWITCHYARD_DELIVERY__WINDOWS",
        "SWITCHYARD_LIMITS__MAX_FRAME",
        "SWITCHYARD_INGRESS__MAX_JSON_BYTE",
        "SWITCHYARD_OUTBOUND__ALLOW_PRIVATES",
        "SWITCHYARD_RETENTION__FILES_TTL",
        "SWITCHYARD_QUOTAS__SOCKET",
        "SWITCHYARD_TELEGRAM__API",
        "SWITCHYARD_SLACK__API",
        "SWITCHYARD_LOG__LEVELS",
        "SWITCHYARD_HOSTS__LOST",
    ] {
        // A provider's section exists when the build lists the provider.
        let built = |name: &str| {
            crate::providers::factories()
                .iter()
                .any(|f| f.name() == name)
        };
        if (var.contains("TELEGRAM") && !built("telegram"))
            || (var.contains("SLACK") && !built("slack"))
        {
            continue;
        }
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env(var, "1");
            let e = Config::load(None).unwrap_err().to_string();
            assert!(e.contains("unknown key") && e.contains(var), "{var}: {e}");
            Ok(())
        });
    }
}

#[test]
#[allow(clippy::result_large_err)]
fn choices_and_log_levels_are_checked_at_load() {
    let refused = |var: &str, value: &str| {
        let mut out = String::new();
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env(var, value);
            out = Config::load(None).unwrap_err().to_string();
            Ok(())
        });
        out
    };
    let e = refused("SWITCHYARD_LOG__FORMAT", "JSON");
    assert!(
        e.contains("log.format") && e.contains("SWITCHYARD_LOG__FORMAT") && e.contains("json"),
        "{e}"
    );
    #[cfg(feature = "telegram")]
    {
        let e = refused("SWITCHYARD_TELEGRAM__MODE", "webhooks");
        assert!(
            e.contains("telegram.mode") && e.contains("polling") && e.contains("auto"),
            "{e}"
        );
    }
    let e = refused("SWITCHYARD_HOSTS__LOST_POLICY", "retry");
    assert!(
        e.contains("hosts.lost_policy") && e.contains("requeue") && e.contains("fail"),
        "{e}"
    );
    let e = refused("SWITCHYARD_LOG__LEVEL", "verbose");
    assert!(
        e.contains("log.level") && e.contains("`verbose` is not a log level"),
        "{e}"
    );
    let e = refused("SWITCHYARD_LOG__LEVEL", "switchyard=loud");
    assert!(e.contains("log.level"), "{e}");
    let e = refused("SWITCHYARD_LOG", "verbose");
    assert!(e.contains("SWITCHYARD_LOG:"), "{e}");
    for ok in ["debug", "WARN", "switchyard=debug,info", "off"] {
        assert_eq!(check_log_filter(ok), Ok(()), "{ok}");
    }
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_LOG__FORMAT", "json");
        #[cfg(feature = "telegram")]
        jail.set_env("SWITCHYARD_TELEGRAM__MODE", "polling");
        jail.set_env("SWITCHYARD_HOSTS__LOST_POLICY", "fail");
        let c = Config::load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.log.format, LogFormat::Json);
        #[cfg(feature = "telegram")]
        assert_eq!(c.providers.get("telegram").unwrap()["mode"], "polling");
        assert_eq!(
            c.hosts.core().lost_policy,
            switchyard_protocol::hosts::HostLostPolicy::Fail
        );
        Ok(())
    });
}

/// A provider's section is its crate's: loaded by name from the file and the
/// environment, its keys checked by its own type, its values validated by its factory.
#[cfg(feature = "slack")]
#[test]
#[allow(clippy::result_large_err)]
fn provider_sections_load_like_tables() {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_SLACK__TURN_TTL", "5s");
        let c = Config::load(None).map_err(|e| e.to_string())?;
        let slack = c
            .providers
            .get("slack")
            .expect("the slack section is listed");
        assert_eq!(slack["turn_ttl"], "5s");
        assert_eq!(slack["api_base"], "https://slack.com/api");
        assert_ne!(c, Config::default());
        jail.set_env("SWITCHYARD_SLACK__API_BASE", "ftp://slack");
        let e = Config::load(None).unwrap_err().to_string();
        assert!(e.contains("slack.api_base must be an http(s) URL"), "{e}");
        Ok(())
    });
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("slack.toml", "[slack]\nlease = \"1s\"\n")?;
        let e = Config::load(Some(Path::new("slack.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown key `slack.lease`")
                && e.contains("slack.toml")
                && e.contains("lease_ttl"),
            "{e}"
        );
        Ok(())
    });
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_SLACK", "1");
        let e = Config::load(None).unwrap_err().to_string();
        assert!(
            e.contains("`slack`") && e.contains("SWITCHYARD_SLACK"),
            "{e}"
        );
        jail.set_env("SWITCHYARD_SLACK", "");
        jail.set_env("SWITCHYARD_SLACK__LEASE_TTL", "soon");
        let e = Config::load(None).unwrap_err().to_string();
        assert!(e.contains("invalid duration"), "{e}");
        Ok(())
    });
}

#[test]
fn trusted_ingress_mode_needs_a_proof() {
    let mut c = Config {
        hosts_client_cert_header: Some("x-ssl-client-cert".into()),
        ..Config::default()
    };
    let e = c.validate().expect_err("no proof configured").to_string();
    assert!(e.contains("hosts_ingress_secret"), "{e}");
    c.hosts_ingress_secret = SecretList(vec![Secret::new("short")]);
    assert!(c.validate().is_err(), "a short secret is refused");
    c.hosts_ingress_secret = SecretList(vec![Secret::new("0123456789abcdef")]);
    c.validate().expect("a secret is proof");
    c.hosts_ingress_secret = SecretList::default();
    c.hosts_ingress_sources = CidrList(vec!["10.0.0.0/8".parse().unwrap()]);
    c.validate().expect("a source range is proof");
}

#[test]
fn operator_tokens_are_judged_trimmed() {
    let mut c = Config::default();
    for bad in [
        "ops=                ",
        "ops=   short-token      ",
        "   =0123456789abcdef",
        "ops",
    ] {
        c.operator_tokens = SecretList(vec![Secret::new(bad)]);
        assert!(c.validate().is_err(), "{bad:?} was accepted");
    }
    let token = "7f3a9c1e5b2d8f4a6c0e9b3d1f7a5c2e";
    c.operator_tokens = SecretList(vec![Secret::new(format!(" ops = {token} "))]);
    assert!(c.validate().is_ok());
    assert_eq!(c.operators(), vec![("ops".to_owned(), token.to_owned())]);
}

/// Finding 4 of issue 23: 16 characters were enough before; a token needs 128 bits of
/// randomness now, and the refusal says how to make one.
#[test]
fn operator_tokens_need_128_bits() {
    let mut c = Config::default();
    for weak in [
        // 16 hex characters (64 bits): accepted before.
        "0123456789abcdef",
        // 31 hex characters: 124 bits.
        "7f3a9c1e5b2d8f4a6c0e9b3d1f7a5c2",
        // Long but hardly random.
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "abababababababababababababababababababab",
        // 21 base64 characters: 126 bits.
        "q8ZkV2xN4pR7tW1yB5mC9",
        // Words and a counted run: judged as hex, 100 bits.
        "operator-token-0123456789",
    ] {
        c.operator_tokens = SecretList(vec![Secret::new(format!("ops={weak}"))]);
        let e = c.validate().expect_err(weak).to_string();
        assert!(e.contains("128") && e.contains("openssl rand"), "{e}");
        assert!(!e.contains(weak), "the token is not echoed: {e}");
    }
    for strong in [
        // openssl rand -hex 16 / -hex 32 / -base64 32
        "7f3a9c1e5b2d8f4a6c0e9b3d1f7a5c2e",
        "9f2c4e81b7a35d60c1e8f4a2b9d07c3e5a61f8d2c4b7e09a3f5d1c8b6e2a4f70",
        "q8ZkV2xN4pR7tW1yB5mC9dLs3HfJ0gUe6iOa7bYcXn4=",
    ] {
        c.operator_tokens = SecretList(vec![Secret::new(format!("ops={strong}"))]);
        assert!(c.validate().is_ok(), "{strong} refused");
    }
}

#[test]
#[allow(clippy::result_large_err)]
fn outbound_allow_private_is_a_list_of_ranges() {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/8, ::1/128");
        let c = Config::load(None).map_err(|e| e.to_string())?;
        let p = c.outbound.policy();
        assert!(p.check_ip("127.0.0.1".parse().unwrap()).is_ok());
        assert!(p.check_ip("::1".parse().unwrap()).is_ok());
        assert!(p.check_ip("10.0.0.1".parse().unwrap()).is_err());
        jail.set_env("SWITCHYARD_OUTBOUND__ALLOW_PRIVATE", "127.0.0.0/33");
        assert!(Config::load(None).is_err());
        Ok(())
    });
    assert!(
        Config::default()
            .outbound
            .policy()
            .check_ip("169.254.169.254".parse().unwrap())
            .is_err()
    );
}

#[test]
// figment's Jail API fixes the closure's error type.
#[allow(clippy::result_large_err)]
fn env_overrides_nested_keys() {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SWITCHYARD_LISTEN", "0.0.0.0:1234");
        jail.set_env("SWITCHYARD_LEASE__CONNECTOR_GRACE", "2s");
        jail.set_env("SWITCHYARD_S3__BUCKET", "b");
        jail.set_env("SWITCHYARD_SIGNING_KEYS", "k1,k2");
        let c = Config::load(None).map_err(|e| e.to_string())?;
        assert_eq!(c.listen, "0.0.0.0:1234");
        assert_eq!(c.lease.connector_grace, Dur(Duration::from_secs(2)));
        assert_eq!(c.s3.bucket.as_deref(), Some("b"));
        assert_eq!(c.signing_keys.0.len(), 2);
        assert!(!format!("{c:?}").contains("k1"));
        Ok(())
    });
}

#[test]
#[cfg(feature = "slack")]
fn provider_keys_are_set_in_code_like_in_a_file() {
    let mut c = Config::default();
    c.providers.set("slack", "lease_ttl", "3s").unwrap();
    assert_eq!(c.providers.get("slack").unwrap()["lease_ttl"], "3s");
    assert_ne!(c, Config::default());
    let e = c.providers.set("slack", "lease", "3s").unwrap_err();
    assert!(e.contains("unknown key `slack.lease`"), "{e}");
    assert!(c.providers.set("nowhere", "x", 1).is_err());
    assert!(c.providers.set("slack", "lease_ttl", "soon").is_err());
}
