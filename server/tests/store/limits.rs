//! Concurrency limits where grants are written: a key never has more
//! LEASED or RUNNING tasks than its limit, whoever grants (racers on their
//! own connections, and on PostgreSQL two store instances as two
//! replicas); a finished task makes room; a raised limit takes effect;
//! tasks of other keys, and without one, are not held back; the usage an
//! explanation reads says how full the limit is.

use std::sync::Arc;

use serde_json::json;
use switchyard_server::model::{
    Completion, CompletionOutcome, GrantOutcome, GrantRefusal, GrantRequest, LimitUsage, NewTask,
};
use switchyard_server::store::Store;
use uuid::Uuid;

use crate::common::{Fixture, Lcg, T0, agents, submit, task};

crate::both_backends!(
    a_concurrency_key_never_runs_more_than_its_limit,
    racing_grants_never_exceed_a_key_limit,
);

fn limited(key: &str) -> NewTask {
    NewTask {
        concurrency_key: Some(key.to_owned()),
        ..task("ns", 0, 3)
    }
}

async fn a_concurrency_key_never_runs_more_than_its_limit(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    store
        .set_concurrency_limit("ns", "deploy", 2, T0)
        .await
        .unwrap();
    assert_eq!(
        store.concurrency_limit("ns", "deploy").await.unwrap(),
        Some(2)
    );
    assert_eq!(store.concurrency_limit("ns", "other").await.unwrap(), None);
    let workers = agents(store, "ns", 2, 4).await;
    let mut keyed = Vec::new();
    for i in 0..5 {
        keyed.push(submit(store, limited("deploy"), T0 + i).await.id);
    }
    let plain = submit(store, task("ns", 0, 3), T0 + 10).await.id;
    let requests: Vec<GrantRequest> = keyed
        .iter()
        .chain([&plain])
        .enumerate()
        .map(|(i, id)| GrantRequest::one_slot(*id, workers[i % 2]))
        .collect();
    let outcomes = store.grant_leases(&requests, T0 + 100).await.unwrap();
    let refused: Vec<_> = outcomes
        .iter()
        .map(|o| matches!(o, GrantOutcome::Refused(GrantRefusal::ConcurrencyLimit)))
        .collect();
    assert_eq!(
        refused,
        [false, false, true, true, true, false],
        "{outcomes:?}"
    );
    let usage = store.limit_usage("ns", Some("deploy")).await.unwrap();
    assert_eq!(
        usage,
        LimitUsage {
            key: Some((2, 2)),
            namespace: None
        }
    );
    assert!(usage.full());
    assert_eq!(
        usage.describe(Some("deploy"), "ns"),
        "concurrency key deploy: 2/2 running"
    );

    // One finishes: one more may run, not two.
    let GrantOutcome::Granted(first) = &outcomes[0] else {
        panic!("granted")
    };
    store
        .complete_leases(
            &[Completion {
                lease_id: first.id,
                task_id: first.task_id,
                agent_id: first.agent_id,
                fencing_token: first.fencing_token,
                outcome: CompletionOutcome::Succeeded { result: json!({}) },
            }],
            T0 + 200,
        )
        .await
        .unwrap();
    let again: Vec<GrantRequest> = keyed[2..]
        .iter()
        .map(|id| GrantRequest::one_slot(*id, workers[0]))
        .collect();
    let outcomes = store.grant_leases(&again, T0 + 300).await.unwrap();
    let granted = outcomes
        .iter()
        .filter(|o| matches!(o, GrantOutcome::Granted(_)))
        .count();
    assert_eq!(granted, 1, "{outcomes:?}");

    // A raised limit takes effect at the next grant.
    store
        .set_concurrency_limit("ns", "deploy", 4, T0 + 400)
        .await
        .unwrap();
    let rest: Vec<GrantRequest> = keyed[3..]
        .iter()
        .map(|id| GrantRequest::one_slot(*id, workers[1]))
        .collect();
    let outcomes = store.grant_leases(&rest, T0 + 500).await.unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, GrantOutcome::Granted(_))),
        "{outcomes:?}"
    );
    assert_eq!(
        store.limit_usage("ns", Some("deploy")).await.unwrap().key,
        Some((4, 4))
    );
}

async fn racing_grants_never_exceed_a_key_limit(fx: &mut Fixture) {
    const LIMIT: u64 = 3;
    let store: Arc<dyn Store> = fx.store.clone();
    store.set_concurrency_limit("ns", "k", 3, T0).await.unwrap();
    let mut task_ids = Vec::new();
    for i in 0..60 {
        task_ids.push(submit(store.as_ref(), limited("k"), T0 + i).await.id);
    }
    let agent_ids = agents(store.as_ref(), "ns", 6, 8).await;
    // Racers on their own connections; on PostgreSQL half of them on a
    // second store instance, as another replica.
    let second = fx.another_instance().await;
    let mut racers = Vec::new();
    for seed in 0..6_u64 {
        let store = if seed % 2 == 0 {
            store.clone()
        } else {
            second.clone()
        };
        let task_ids = task_ids.clone();
        let agent_ids = agent_ids.clone();
        racers.push(tokio::spawn(async move {
            let mut rng = Lcg(seed + 1);
            let mut granted: Vec<Uuid> = Vec::new();
            for chunk in task_ids.chunks(4) {
                let requests: Vec<GrantRequest> = chunk
                    .iter()
                    .map(|&id| GrantRequest::one_slot(id, agent_ids[rng.next(agent_ids.len())]))
                    .collect();
                for outcome in store.grant_leases(&requests, T0 + 1_000).await.unwrap() {
                    if let GrantOutcome::Granted(lease) = outcome {
                        granted.push(lease.task_id);
                    }
                }
            }
            granted
        }));
    }
    let mut granted = Vec::new();
    for racer in racers {
        granted.extend(racer.await.unwrap());
    }
    assert_eq!(granted.len() as u64, LIMIT, "{granted:?}");
    assert_eq!(
        store.limit_usage("ns", Some("k")).await.unwrap().key,
        Some((LIMIT, LIMIT))
    );
}
