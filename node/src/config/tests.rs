//! Settings from flags, environment and TOML; validation.

use super::*;

#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    config: Config,
}

fn flags(args: &[&str]) -> Result<Config, clap::Error> {
    use clap::Parser;
    Flags::try_parse_from(std::iter::once("raftlockd").chain(args.iter().copied()))
        .map(|f| f.config)
}

#[test]
fn every_setting_is_a_flag_with_the_toml_meaning() {
    let c = flags(&[
        "--id",
        "2",
        "--listen",
        "127.0.0.1:7102",
        "--peers",
        "1=a:1,2=b:2/b:3",
        "--init",
        "--dial",
        "1=p:9",
        "--tls-client-auth",
        "--heartbeat-ms",
        "50",
    ])
    .expect("parse");
    assert_eq!(c.id, Some(2));
    assert_eq!(c.init, Some(true));
    assert_eq!(c.tls_client_auth, Some(true));
    assert_eq!(c.heartbeat_ms, Some(50));
    assert_eq!(
        c.peers,
        Some(BTreeMap::from([
            (1, "a:1".to_string()),
            (2, "b:2/b:3".to_string())
        ]))
    );
    assert_eq!(c.dial, Some(BTreeMap::from([(1, "p:9".to_string())])));
    // Unset flags leave the file's value in force.
    let none = flags(&[]).expect("parse");
    assert_eq!(none, Config::default());
    let toml: Config = toml::from_str("init = true\n[peers]\n1 = \"a:1\"\n").expect("toml");
    assert_eq!(none.or(toml.clone()), toml);
    // A bad list is refused, naming the setting.
    let e = flags(&["--peers", "1=a:1,x=b:2"]).expect_err("bad peers");
    assert!(e.to_string().contains("invalid setting `peers`"), "{e}");
}

/// A node of a multi-member cluster on a trusted network.
fn base() -> Config {
    Config {
        id: Some(1),
        listen: Some("127.0.0.1:7101".parse().expect("addr")),
        data_dir: Some("/tmp/x".into()),
        insecure_peers: Some(true),
        ..Config::default()
    }
}

#[test]
fn peers_must_be_authenticated_unless_the_operator_opts_out() {
    let open = Config {
        insecure_peers: None,
        ..base()
    };
    // A node that joins or bootstraps a multi-member cluster.
    for config in [
        open.clone(),
        Config {
            init: Some(true),
            peers: Some(BTreeMap::from([
                (1, "127.0.0.1:7101".to_string()),
                (2, "127.0.0.1:7102".to_string()),
            ])),
            ..open.clone()
        },
        Config {
            insecure_peers: Some(false),
            ..open.clone()
        },
    ] {
        let e = config.validate().map(drop).expect_err("refused");
        assert_eq!(e.setting, "insecure_peers");
        assert!(e.reason.contains("--insecure-peers"), "{e}");
        assert!(e.reason.contains("peer_token"), "{e}");
    }
    // A single-node cluster has no peers.
    let single = Config {
        init: Some(true),
        ..open.clone()
    };
    single
        .validate()
        .expect("a single node needs no peer authentication");
    // The flag and the variable opt out.
    assert_eq!(
        flags(&["--insecure-peers"]).expect("parse").insecure_peers,
        Some(true)
    );
    let toml: Config = toml::from_str("insecure_peers = true\n").expect("toml");
    open.or(toml).validate().expect("opted out");
}

#[test]
fn a_minimal_config_is_valid_and_defaults_apply() {
    let (opts, listen) = base().validate().expect("valid");
    assert_eq!(listen.client.port(), 7101);
    assert_eq!(opts.advertise, "127.0.0.1:7101");
    assert_eq!(opts.timing.heartbeat, Duration::from_millis(100));
    assert!(!opts.init);
}

#[test]
fn each_bad_setting_is_named() {
    let cases: Vec<(Config, &str)> = vec![
        (Config { id: None, ..base() }, "id"),
        (
            Config {
                id: Some(0),
                ..base()
            },
            "id",
        ),
        (
            Config {
                listen: None,
                ..base()
            },
            "listen",
        ),
        (
            Config {
                listen: Some("127.0.0.1:0".parse().expect("addr")),
                ..base()
            },
            "listen",
        ),
        (
            Config {
                data_dir: None,
                ..base()
            },
            "data_dir",
        ),
        (
            Config {
                advertise: Some("nohost".into()),
                ..base()
            },
            "advertise",
        ),
        (
            Config {
                init: Some(true),
                peers: Some([(2, "h:1".to_string())].into()),
                ..base()
            },
            "peers",
        ),
        (
            Config {
                peers: Some([(3, "h".to_string())].into()),
                ..base()
            },
            "peers",
        ),
        (
            Config {
                peers: Some([(3, "h:1/".to_string())].into()),
                ..base()
            },
            "peers",
        ),
        (
            Config {
                peers: Some([(3, "h:1/h:2/h:3".to_string())].into()),
                ..base()
            },
            "peers",
        ),
        (
            Config {
                peer_advertise: Some("h:1".into()),
                ..base()
            },
            "peer_advertise",
        ),
        (
            Config {
                peer_listen: Some("127.0.0.1:7101".parse().expect("addr")),
                ..base()
            },
            "peer_listen",
        ),
        (
            Config {
                peer_listen: Some("127.0.0.1:0".parse().expect("addr")),
                ..base()
            },
            "peer_listen",
        ),
        (
            Config {
                peer_listen: Some("127.0.0.1:7201".parse().expect("addr")),
                peer_advertise: Some("nohost".into()),
                ..base()
            },
            "peer_advertise",
        ),
        (
            Config {
                heartbeat_ms: Some(600),
                ..base()
            },
            "election_timeout_min_ms",
        ),
        (
            Config {
                election_timeout_max_ms: Some(250),
                ..base()
            },
            "election_timeout_max_ms",
        ),
        (
            Config {
                snapshot_every: Some(0),
                ..base()
            },
            "snapshot_every",
        ),
    ];
    for (config, setting) in cases {
        assert_eq!(
            config.validate().err().map(|e| e.setting),
            Some(setting),
            "{config:?}"
        );
    }
}

#[test]
fn init_without_peers_bootstraps_a_single_node() {
    let (opts, _) = Config {
        init: Some(true),
        ..base()
    }
    .validate()
    .expect("valid");
    assert_eq!(
        opts.peers.get(&1),
        Some(&NodeAddrs::shared("127.0.0.1:7101"))
    );
}

#[test]
fn a_separate_peer_listener_is_advertised_and_bootstrapped() {
    let (opts, listen) = Config {
        init: Some(true),
        peer_listen: Some("127.0.0.1:7201".parse().expect("addr")),
        ..base()
    }
    .validate()
    .expect("valid");
    assert_eq!(listen.peer.map(|p| p.port()), Some(7201));
    assert_eq!(opts.peer_advertise.as_deref(), Some("127.0.0.1:7201"));
    assert_eq!(
        opts.peers.get(&1),
        Some(&NodeAddrs::new("127.0.0.1:7101", "127.0.0.1:7201"))
    );
    let (opts, _) = Config {
        peers: Some([(1, "a:1".into()), (2, " b:1 / b:2 ".into())].into()),
        peer_listen: Some("127.0.0.1:7201".parse().expect("addr")),
        peer_advertise: Some("node-1.peers:7201".into()),
        ..base()
    }
    .validate()
    .expect("valid");
    assert_eq!(opts.peer_advertise.as_deref(), Some("node-1.peers:7201"));
    assert_eq!(opts.peers.get(&1), Some(&NodeAddrs::shared("a:1")));
    assert_eq!(opts.peers.get(&2), Some(&NodeAddrs::new("b:1", "b:2")));
}

#[test]
fn peers_parse_and_reject_garbage() {
    let peers = parse_peers("1=127.0.0.1:7101, 2=127.0.0.1:7102").expect("parses");
    assert_eq!(peers.len(), 2);
    assert!(parse_peers("1:127.0.0.1:7101").is_err());
    assert!(parse_peers("x=127.0.0.1:7101").is_err());
    assert!(parse_peers("1=a:1,1=b:2").is_err());
}

#[test]
fn flags_override_the_file_and_unknown_file_keys_are_refused() {
    let file: Config = toml::from_str(
        "id = 5\nlisten = \"127.0.0.1:9000\"\ndata_dir = \"/d\"\n[peers]\n5 = \"127.0.0.1:9000\"\n",
    )
    .expect("toml");
    let merged = Config {
        id: Some(6),
        ..Config::default()
    }
    .or(file);
    assert_eq!(merged.id, Some(6));
    assert_eq!(merged.listen.map(|l| l.port()), Some(9000));
    assert!(toml::from_str::<Config>("idd = 5").is_err());
}

#[test]
fn an_acl_file_turns_access_control_on_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    assert!(base().validate().expect("valid").0.auth.current().is_none());
    let good = dir.path().join("acl.toml");
    std::fs::write(
        &good,
        "peer_token = \"0123456789abcdef\"\n[[rule]]\nidentity = \"a\"\nallow = \"read\"\n",
    )
    .expect("write");
    // An ACL file authenticates peers (its peer_token): no opt-out needed.
    let (opts, _) = Config {
        acl_file: Some(good),
        insecure_peers: None,
        ..base()
    }
    .validate()
    .expect("valid");
    assert_eq!(opts.auth.current().expect("on").rules().len(), 1);
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "peer_token = \"short\"\n").expect("write");
    for path in [bad, dir.path().join("missing.toml")] {
        let e = Config {
            acl_file: Some(path.clone()),
            ..base()
        }
        .validate()
        .expect_err("refused");
        assert_eq!(e.setting, "acl_file", "{path:?}: {e}");
    }
}

#[test]
fn half_made_tls_is_refused_naming_what_is_missing() {
    let dir = tempfile::tempdir().expect("dir");
    let pem = dir.path().join("x.pem");
    std::fs::write(&pem, "-----BEGIN CERTIFICATE-----\n").expect("write");
    let not_pem = dir.path().join("x.txt");
    std::fs::write(&not_pem, "hello").expect("write");
    let some = || Some(pem.clone());
    let cases: Vec<(Config, &str)> = vec![
        (
            Config {
                tls_cert: some(),
                ..base()
            },
            "tls_key",
        ),
        (
            Config {
                tls_cert: some(),
                tls_key: some(),
                ..base()
            },
            "tls_ca",
        ),
        (
            Config {
                tls_key: some(),
                tls_ca: some(),
                ..base()
            },
            "tls_cert",
        ),
        (
            Config {
                tls_client_auth: Some(true),
                ..base()
            },
            "tls_cert",
        ),
        (
            Config {
                tls_cert: Some(not_pem.clone()),
                tls_key: some(),
                tls_ca: some(),
                ..base()
            },
            "tls_cert",
        ),
        (
            Config {
                tls_cert: some(),
                tls_key: some(),
                tls_ca: Some(dir.path().join("nope")),
                ..base()
            },
            "tls_ca",
        ),
    ];
    for (config, setting) in cases {
        assert_eq!(
            config.validate().err().map(|e| e.setting),
            Some(setting),
            "{config:?}"
        );
    }
    let (opts, _) = Config {
        tls_cert: some(),
        tls_key: some(),
        tls_ca: some(),
        ..base()
    }
    .validate()
    .expect("complete TLS settings are accepted");
    assert!(opts.tls.is_some_and(|t| !t.client_auth));
}

#[test]
fn the_prefix_label_cap_is_checked_at_its_edges() {
    use crate::metrics::{PrefixLabels, MAX_PREFIX_LABELS};
    let with = |depth: Option<usize>, max: Option<usize>| Config {
        metrics_prefix_depth: depth,
        metrics_prefix_labels: max,
        ..base()
    };
    let (opts, _) = with(None, None).validate().expect("defaults");
    assert_eq!(opts.prefix_labels, PrefixLabels::default());
    for max in [1, MAX_PREFIX_LABELS] {
        let (opts, _) = with(Some(3), Some(max)).validate().expect("in range");
        assert_eq!(opts.prefix_labels, PrefixLabels { depth: 3, max });
    }
    for max in [0, MAX_PREFIX_LABELS + 1] {
        let e = with(None, Some(max))
            .validate()
            .map(drop)
            .expect_err("refused");
        assert_eq!(e.setting, "metrics_prefix_labels");
    }
}
