//! `raftlock`: the command-line tool.
//!
//! Exit codes: the command's own code for `lock`, `sem` and `elect`
//! (128 + N if it died of signal N); 3 if the lock was not granted in time;
//! 4 if the lease was lost while the command ran (it is sent SIGTERM); 1 for
//! any other error; 2 for bad usage.

/// `println!` for the CLI's output: a closed stdout ends the process
/// quietly (see [`signals::write_stdout`]) instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::signals::write_stdout(format_args!($($arg)*))
    };
}

mod backup;
mod cli;
mod hold;
mod output;
mod signals;

use std::process::ExitCode;

use clap::Parser;
use raftlock_client::{Client, Election, Error, Mode};
use serde_json::json;

use cli::{read_token, tls_options, Cli, Cmd, MembersCmd, SessionCmd, SnapshotCmd};
use futures::StreamExt;
use hold::{finish, hold_all_and_run, hold_and_run, not_acquired, open, run_child, timeout};
use output::{
    info_json, last_fence, member_json, print_event, print_info, print_members, print_status,
    status_json,
};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let tls = match tls_options(&cli) {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("raftlock: {e}");
            return ExitCode::from(2);
        }
    };
    let token = match cli.token_file.as_deref().map(read_token).transpose() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("raftlock: {e}");
            return ExitCode::from(2);
        }
    };
    let options = raftlock_client::ClientOptions {
        tls,
        token,
        ..Default::default()
    };
    let client = match Client::with_options(cli.endpoints.split(','), options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("raftlock: {e}");
            return ExitCode::from(2);
        }
    };
    match run(client, cli.command).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("raftlock: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(client: Client, cmd: Cmd) -> Result<u8, Error> {
    match cmd {
        Cmd::Lock {
            names,
            shared,
            hold,
        } => {
            let session = open(&client, &hold).await?;
            if let [name] = names.as_slice() {
                let guard = session
                    .lock_with(name, shared, timeout(&hold), Vec::new())
                    .await;
                return hold_and_run(session, guard, name, &hold).await;
            }
            let mode = if shared {
                Mode::Shared
            } else {
                Mode::Exclusive
            };
            let locks: Vec<(&str, Mode)> = names.iter().map(|n| (n.as_str(), mode)).collect();
            let guards = session.lock_all(&locks, timeout(&hold)).await;
            hold_all_and_run(session, guards, &names, &hold).await
        }
        Cmd::Sem {
            name,
            capacity,
            weight,
            hold,
        } => {
            let session = open(&client, &hold).await?;
            let sem = session.semaphore(&name, capacity);
            let guard = match timeout(&hold) {
                Some(t) => sem.acquire_timeout(weight, t).await,
                None => sem.acquire(weight).await,
            };
            hold_and_run(session, guard, &name, &hold).await
        }
        Cmd::Elect { name, value, hold } => {
            let session = open(&client, &hold).await?;
            let mut election = Election::new(session.clone(), &name);
            let campaign = election.campaign(value.into_bytes());
            let fence = match timeout(&hold) {
                Some(t) => tokio::time::timeout(t, campaign)
                    .await
                    .unwrap_or(Err(Error::NotAcquired(t))),
                None => campaign.await,
            };
            match fence {
                Ok(fence) => {
                    let code = run_child(&session, &name, fence, &hold.command, &[]).await;
                    if session.is_valid() {
                        election.resign().await.ok();
                    }
                    finish(&session, None).await;
                    code
                }
                Err(e) => not_acquired(e, &name, &session).await,
            }
        }
        Cmd::Describe { name, json } => {
            let info = client.describe(&name).await?;
            if json {
                out!("{}", info.as_ref().map_or(json!(null), info_json));
            } else {
                match info {
                    None => out!("{name}: free"),
                    Some(info) => print_info(&info),
                }
            }
            Ok(0)
        }
        Cmd::List { prefix, json } => {
            let all = client.list(&prefix).await?;
            if json {
                out!("{}", json!(all.iter().map(info_json).collect::<Vec<_>>()));
            } else if all.is_empty() {
                out!("(none)");
            } else {
                for info in &all {
                    print_info(info);
                }
            }
            Ok(0)
        }
        Cmd::Watch { prefix, json } => {
            let mut events = client.watch(&prefix, true).await?;
            loop {
                match events.next().await {
                    Some(Ok(e)) => print_event(&e, json),
                    None => return Ok(0),
                    Some(Err(e)) => return Err(e),
                }
            }
        }
        Cmd::Status { json } => {
            let s = client.status().await?;
            if json {
                out!("{}", status_json(&s));
            } else {
                print_status(&s);
            }
            Ok(0)
        }
        Cmd::Snapshot {
            action: SnapshotCmd::Save { file },
        } => {
            let backup = client.backup().await?;
            // Verified before it is written: a file on disk is one that
            // checks.
            let header = match raftlock_client::backup::decode(&backup.snapshot) {
                Ok(raftlock_client::backup::Backup::Checked { header, .. }) => header,
                Ok(_) => {
                    return Err(Error::Internal(
                        "the node sent a backup without a checksum (an older raftlockd?)".into(),
                    ))
                }
                Err(e) => return Err(Error::Internal(format!("the node sent a {e}"))),
            };
            backup::write_private(&file, &backup.snapshot)?;
            out!(
                "saved {} bytes at index {} ({} sessions, {} grants, last fence {}; checksum verified) to {}",
                backup.snapshot.len(),
                backup.index,
                header.sessions,
                header.grants,
                last_fence(backup.last_fence),
                file.display()
            );
            Ok(0)
        }
        Cmd::Snapshot {
            action: SnapshotCmd::Inspect { file, json },
        } => match backup::inspect(&file, json) {
            Ok(()) => Ok(0),
            Err(e) => {
                eprintln!("raftlock: {e}");
                Ok(1)
            }
        },
        Cmd::Snapshot {
            action: SnapshotCmd::Restore { file, fence_bump },
        } => {
            // Checked here first: a damaged file is named before anything
            // is sent (the node checks it again).
            let bytes = match backup::read_checked(&file) {
                Ok(bytes) => bytes,
                Err(e) => {
                    eprintln!("raftlock: {e}");
                    return Ok(1);
                }
            };
            let r = client.restore_with(bytes, fence_bump).await?;
            out!(
                "restored {} sessions; fences continue after {}",
                r.sessions,
                r.last_fence
            );
            Ok(0)
        }
        Cmd::Session {
            action: SessionCmd::Revoke { id, json },
        } => match client.revoke_session(id).await {
            Ok(released) => {
                if json {
                    out!("{}", json!({ "session_id": id, "released": released }));
                } else {
                    out!("revoked session {id}; {released} grants ended");
                }
                Ok(0)
            }
            Err(Error::SessionNotFound(msg)) => {
                eprintln!(
                    "raftlock: session {id} is not open (never opened, ended, or revoked \
                     already): {msg}"
                );
                Ok(1)
            }
            Err(e) => Err(e),
        },
        Cmd::Members { action, json } => {
            let members = match action.unwrap_or(MembersCmd::List) {
                MembersCmd::List => client.members().await?,
                MembersCmd::Add {
                    id,
                    addr,
                    peer_addr,
                    timeout,
                } => {
                    client
                        .add_node_with(id, &addr, peer_addr.as_deref(), false, timeout)
                        .await?
                }
                MembersCmd::Remove { id } => client.remove_node(id).await?,
                MembersCmd::TransferLeader { id } => {
                    return transfer_leader(&client, id, json).await
                }
            };
            if json {
                out!(
                    "{}",
                    json!(members.iter().map(member_json).collect::<Vec<_>>())
                );
            } else {
                print_members(&members);
            }
            Ok(0)
        }
    }
}

/// `raftlock members transfer-leader [ID]`.
async fn transfer_leader(client: &Client, id: Option<u64>, json: bool) -> Result<u8, Error> {
    let leader = client.transfer_leader(id).await?;
    if json {
        let (id, addr) = leader.unwrap_or_default();
        println!("{}", json!({ "leader_id": id, "leader_addr": addr }));
    } else {
        match leader {
            Some((id, addr)) => println!("leader: {id} {addr}"),
            None => println!(
                "the old leader stepped down; `raftlock status` shows the new one once elected"
            ),
        }
    }
    Ok(0)
}
