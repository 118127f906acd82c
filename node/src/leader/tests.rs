//! Tests of the leadership view: the term a node leads, what a view allows,
//! and readiness.

use super::*;

#[test]
fn a_node_leads_the_term_of_its_own_committed_vote_only() {
    assert!(leads_term(1, &Vote::new_committed(3, 1)));
    assert!(
        !leads_term(1, &Vote::new(3, 1)),
        "a vote for itself, not yet granted"
    );
    assert!(
        !leads_term(1, &Vote::new_committed(3, 2)),
        "another node's term"
    );
}

fn view(role: Role) -> View {
    View {
        role,
        term: 3,
        leader: Some(1),
        ready: true,
        quorum_lost: false,
        fatal: None,
    }
}

#[test]
fn only_a_caught_up_leader_in_touch_with_a_quorum_works_and_says_leader() {
    let working = view(Role::Leader);
    assert!(working.working_leader());
    assert_eq!(working.status_role(), "leader");
    let restored = View {
        ready: false,
        ..view(Role::Leader)
    };
    assert!(!restored.working_leader());
    assert_eq!(restored.status_role(), "candidate");
    assert!(
        restored.serving(),
        "a leader catching up still serves writes"
    );
    let cut_off = View {
        quorum_lost: true,
        ..view(Role::Leader)
    };
    assert!(!cut_off.working_leader());
    assert!(!cut_off.serving());
    assert!(view(Role::Follower).serving());
    assert!(!view(Role::Follower).working_leader());
}

#[test]
fn a_stopped_core_never_serves() {
    let dead = View {
        fatal: Some("disk full in /data".into()),
        ..view(Role::Leader)
    };
    assert!(!dead.serving());
    assert!(!View {
        role: Role::Stopped,
        fatal: None,
        ..view(Role::Follower)
    }
    .serving());
    let leaderless = View {
        leader: None,
        ..view(Role::Follower)
    };
    assert!(!leaderless.serving());
}

#[test]
fn ready_means_a_leader_heard_from_lately_a_running_core_and_applied_close_to_committed() {
    let ms = Duration::from_millis;
    let follower = View {
        leader: Some(1),
        ..view(Role::Follower)
    };
    let silence = ms(300);
    let heard = |silent| {
        Some(Contact {
            silent,
            quorum_lost: false,
        })
    };
    assert_eq!(
        readiness(&follower, 2, heard(ms(10)), silence, 50, 50),
        Ok(())
    );
    // Silence, at the edge and past it.
    assert_eq!(
        readiness(&follower, 2, heard(silence), silence, 50, 50),
        Ok(())
    );
    let err = readiness(&follower, 2, heard(ms(301)), silence, 50, 50).unwrap_err();
    assert!(err.contains("no word from leader 1"), "{err}");
    assert!(readiness(&follower, 2, None, silence, 50, 50).is_err());
    // A leader heard from lately that says it has lost its quorum.
    let cut_off_leader = Some(Contact {
        silent: ms(10),
        quorum_lost: true,
    });
    let err = readiness(&follower, 2, cut_off_leader, silence, 50, 50).unwrap_err();
    assert!(err.contains("heard from no quorum"), "{err}");
    // Apply lag, at the edge and past it.
    let edge = READY_MAX_APPLY_LAG;
    assert_eq!(
        readiness(&follower, 2, heard(ms(1)), silence, 7, 7 + edge),
        Ok(())
    );
    let err = readiness(&follower, 2, heard(ms(1)), silence, 7, 8 + edge).unwrap_err();
    assert!(err.contains("entries behind"), "{err}");
    // No leader.
    let leaderless = View {
        leader: None,
        ..view(Role::Candidate)
    };
    let err = readiness(&leaderless, 2, heard(ms(1)), silence, 5, 5).unwrap_err();
    assert!(err.contains("no leader"), "{err}");
    // The leader counts its quorum, not its own silence.
    let leader = view(Role::Leader);
    assert_eq!(readiness(&leader, 1, None, silence, 5, 5), Ok(()));
    let cut_off = View {
        quorum_lost: true,
        ..view(Role::Leader)
    };
    assert!(readiness(&cut_off, 1, None, silence, 5, 5).is_err());
    // A stopped core.
    let dead = View {
        fatal: Some("disk full in /data".into()),
        ..view(Role::Follower)
    };
    let err = readiness(&dead, 2, heard(ms(1)), silence, 5, 5).unwrap_err();
    assert!(err.contains("node has stopped: disk full"), "{err}");
}
