//! The limits the Go, Python and PHP clients check before sending are the
//! cluster's (`node/src/state/limits.rs`), and they retry and back off as
//! the Rust client does (docs/clients/writing-a-client.md, "Follow the leader hint at once"). Each client keeps its own copy
//! in its own language, so nothing else ties them together: a limit
//! changed in the node and not in a client makes that client refuse what
//! the cluster takes, or send what it refuses with a transport error
//! instead of the rule (the seed-user walk of 2026-11-29 found both kinds
//! of drift between the clients).

use std::path::PathBuf;

use raftlock_node::state::limits;

fn source(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The value of constant `name` in `src`: the text after `=` on the line
/// that declares it (`const NAME = …;`, `NAME = …`), without a trailing
/// `;` or comment.
fn declared(src: &str, file: &str, name: &str) -> String {
    let mut found = src.lines().filter_map(|line| {
        let line = line.trim();
        let line = line
            .strip_prefix("public const ")
            .or_else(|| line.strip_prefix("const "))
            .unwrap_or(line);
        let (lhs, rhs) = line.split_once('=')?;
        (lhs.trim() == name).then(|| {
            let rhs = rhs.split("//").next().unwrap_or(rhs);
            let rhs = rhs.split('#').next().unwrap_or(rhs);
            rhs.trim().trim_end_matches(';').trim().to_string()
        })
    });
    let value = found
        .next()
        .unwrap_or_else(|| panic!("{file} declares no constant {name}"));
    assert!(found.next().is_none(), "{file} declares {name} twice");
    value
}

/// A plain number (`512`, `1_000_000`, `3600.0`).
fn number(text: &str) -> f64 {
    text.replace('_', "")
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} is not a number: {e}"))
}

/// A Go duration constant (`time.Second`, `60 * time.Second`), in ms.
fn go_ms(text: &str) -> f64 {
    let (count, unit) = match text.split_once('*') {
        Some((n, unit)) => (number(n.trim()), unit.trim()),
        None => (1.0, text),
    };
    let unit_ms = match unit {
        "time.Millisecond" => 1.0,
        "time.Second" => 1_000.0,
        "time.Minute" => 60_000.0,
        "time.Hour" => 3_600_000.0,
        other => panic!("{other:?} is not a Go time unit"),
    };
    count * unit_ms
}

struct Client {
    file: &'static str,
    src: String,
}

impl Client {
    fn new(file: &'static str) -> Self {
        Client {
            file,
            src: source(file),
        }
    }

    fn get(&self, name: &str) -> String {
        declared(&self.src, self.file, name)
    }
}

#[test]
fn the_clients_check_the_clusters_limits() {
    let php = Client::new("client/php/src/Client.php");
    let py = Client::new("client/python/src/raftlock/_core.py");
    let go = Client::new("client/go/raftlock.go");
    let go_multi = Client::new("client/go/multi.go");
    let go_lock = Client::new("client/go/lock.go");

    let name = limits::MAX_NAME_LEN as f64;
    assert_eq!(number(&php.get("MAX_NAME_BYTES")), name, "PHP");
    assert_eq!(number(&py.get("NAME_MAX_BYTES")), name, "Python");
    assert_eq!(number(&go.get("MaxKeyBytes")), name, "Go");

    let min_ttl = limits::MIN_SESSION_TTL_MS as f64;
    assert_eq!(number(&php.get("MIN_TTL_MS")), min_ttl, "PHP");
    assert_eq!(number(&py.get("TTL_MIN")) * 1_000.0, min_ttl, "Python");
    assert_eq!(go_ms(&go.get("MinTTL")), min_ttl, "Go");

    let max_ttl = limits::MAX_SESSION_TTL_MS as f64;
    assert_eq!(number(&php.get("MAX_TTL_MS")), max_ttl, "PHP");
    assert_eq!(number(&py.get("TTL_MAX")) * 1_000.0, max_ttl, "Python");
    assert_eq!(go_ms(&go.get("MaxTTL")), max_ttl, "Go");

    let capacity = f64::from(limits::MAX_CAPACITY);
    assert_eq!(number(&php.get("MAX_CAPACITY")), capacity, "PHP");
    assert_eq!(number(&py.get("CAPACITY_MAX")), capacity, "Python");
    assert_eq!(number(&go_lock.get("MaxCapacity")), capacity, "Go");

    let names = limits::MAX_NAMES_PER_REQUEST as f64;
    assert_eq!(number(&php.get("MAX_NAMES_PER_LOCK_ALL")), names, "PHP");
    assert_eq!(number(&py.get("ACQUIRE_ALL_MAX")), names, "Python");
    assert_eq!(number(&go_multi.get("MaxKeysPerAcquireAll")), names, "Go");

    assert_eq!(
        number(&py.get("VALUE_MAX_BYTES")),
        limits::MAX_VALUE_LEN as f64,
        "Python"
    );
    assert_eq!(
        number(&py.get("END_ON_DISCONNECT_MAX")) * 1_000.0,
        limits::MAX_END_ON_DISCONNECT_MS as f64,
        "Python"
    );
    assert_eq!(
        go_ms(&go.get("MaxEndOnDisconnect")),
        limits::MAX_END_ON_DISCONNECT_MS as f64,
        "Go"
    );
    assert_eq!(
        number(&php.get("MAX_END_ON_DISCONNECT_MS")),
        limits::MAX_END_ON_DISCONNECT_MS as f64,
        "PHP"
    );
    // The default grace is the same in every client.
    let grace = go_ms(&go.get("DefaultEndOnDisconnect"));
    assert_eq!(
        raftlock_client::SessionOptions::default()
            .end_on_disconnect
            .map(|g| g.as_millis() as f64),
        Some(grace),
        "Go and Rust"
    );
    assert_eq!(
        number(&py.get("DEFAULT_END_ON_DISCONNECT")) * 1_000.0,
        grace,
        "Go and Python"
    );
    assert_eq!(
        number(&php.get("DEFAULT_END_ON_DISCONNECT_MS")),
        grace,
        "Go and PHP"
    );
}

#[test]
fn the_clients_retry_and_back_off_as_the_rust_client() {
    let rust = raftlock_client::ClientOptions::default();
    let first = rust.initial_backoff.as_secs_f64() * 1_000.0;
    let max = rust.max_backoff.as_secs_f64() * 1_000.0;
    let deadline = rust.retry_deadline.as_secs_f64() * 1_000.0;

    let php = Client::new("client/php/src/Client.php");
    assert_eq!(number(&php.get("INITIAL_BACKOFF")) * 1_000.0, first, "PHP");
    assert_eq!(number(&php.get("MAX_BACKOFF")) * 1_000.0, max, "PHP");
    assert_eq!(
        number(&php.get("DEFAULT_RETRY_TIMEOUT")) * 1_000.0,
        deadline,
        "PHP"
    );

    let py = Client::new("client/python/src/raftlock/_core.py");
    assert_eq!(
        number(&py.get("INITIAL_BACKOFF")) * 1_000.0,
        first,
        "Python"
    );
    assert_eq!(number(&py.get("MAX_BACKOFF")) * 1_000.0, max, "Python");
    assert_eq!(
        number(&py.get("RETRY_DEADLINE")) * 1_000.0,
        deadline,
        "Python"
    );

    let go = Client::new("client/go/transport.go");
    assert_eq!(go_ms(&go.get("firstBackoff")), first, "Go");
    assert_eq!(go_ms(&go.get("maxBackoff")), max, "Go");

    // Every endpoint refused (or did not resolve) this many times in a
    // row: the request gives up at once.
    let rounds = f64::from(raftlock_client::REFUSED_ROUNDS);
    assert_eq!(number(&go.get("refusedRounds")), rounds, "Go");
    assert_eq!(number(&php.get("REFUSED_ROUNDS")), rounds, "PHP");
    assert_eq!(number(&py.get("REFUSED_ROUNDS")), rounds, "Python");
    let go = Client::new("client/go/raftlock.go");
    assert_eq!(go_ms(&go.get("DefaultRetryTimeout")), deadline, "Go");
}

/// The parser itself, on each form it reads.
#[test]
fn constants_are_read_in_each_language_form() {
    let src = "public const A = 1000;\nB = 3600.0  # s\n\tC = 60 * time.Second // why\nconst D = time.Hour\n";
    assert_eq!(number(&declared(src, "t", "A")), 1_000.0);
    assert_eq!(number(&declared(src, "t", "B")), 3_600.0);
    assert_eq!(go_ms(&declared(src, "t", "C")), 60_000.0);
    assert_eq!(go_ms(&declared(src, "t", "D")), 3_600_000.0);
}

/// The Rust client takes the largest answer a node sends: a backup of
/// `MAX_BACKUP_BYTES`.
#[test]
fn the_rust_client_takes_the_largest_backup_a_node_sends() {
    assert_eq!(
        raftlock_client::MAX_MESSAGE_BYTES,
        raftlock_node::node::MAX_BACKUP_BYTES
    );
}
