//! Agent registration (upsert, epochs, generations), document
//! compare-and-set, operator overrides, status (and a new session's
//! readying), drain, last seen, listing
//! (by pages, and every id at once).

use serde_json::json;
use switchyard_server::error::Error;
use switchyard_server::model::Page;
use switchyard_server::model::{AgentParts, AgentStatus};
use switchyard_server::store::{ReportedDocument, Store};
use uuid::Uuid;

use crate::common::{Fixture, T0, TestStore, agent};

crate::both_backends!(
    register_is_an_upsert_with_new_epoch,
    document_generation_compare_and_set,
    status_drain_touch_and_list,
    a_drain_keeps_its_reason_while_the_agent_reports_up,
    a_session_readies_its_agent_and_gets_it_as_stored,
);

async fn register_is_an_upsert_with_new_epoch(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let first = agent(store, "ns", "host-a", 4).await;
    assert_eq!(first.id.get_version_num(), 7);
    assert_eq!((first.session_epoch, first.generation), (1, 1));
    assert_eq!(first.status, AgentStatus::Ready);
    assert_eq!(first.capacity, 4);
    assert_eq!(first.operator_overrides, json!({}));
    let again = agent(store, "ns", "host-a", 6).await;
    assert_eq!(again.id, first.id);
    assert_eq!((again.session_epoch, again.generation), (2, 2));
    assert_eq!(again.capacity, 6);
    let elsewhere = agent(store, "other", "host-a", 1).await;
    assert_ne!(elsewhere.id, first.id);
    assert_eq!(store.get_agent(first.id).await.unwrap(), again);
    let namespaces = ["ns", "other"];
    let mut all = 0;
    for ns in namespaces {
        all += store.agents_of(ns).await.unwrap().len();
    }
    assert_eq!(all, 2);
    let missing = store.get_agent(Uuid::now_v7()).await.unwrap_err();
    assert!(matches!(missing, Error::NotFound { what: "agent", .. }));

    // What a registration returns is what a read finds, documents, nested
    // numbers and the operator tier kept over it included.
    let gpu = crate::common::gpu_agent(store, "ns", "host-g", 2).await;
    assert_eq!(store.get_agent(gpu.id).await.unwrap(), gpu);
    let tier = json!({"tags": ["blessed"]});
    store
        .set_operator_overrides(gpu.id, &tier, &gpu.document, &gpu.provenance, T0)
        .await
        .unwrap();
    let back = crate::common::gpu_agent(store, "ns", "host-g", 2).await;
    assert_eq!(back.operator_overrides, tier);
    assert_eq!(store.get_agent(gpu.id).await.unwrap(), back);
}

async fn document_generation_compare_and_set(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let a = agent(store, "ns", "host-a", 1).await;
    let doc = json!({"tags": ["linux", "gpu"]});
    let generation = store
        .update_agent_document(
            a.id,
            a.generation,
            &ReportedDocument {
                reported: doc.clone(),
                document: doc.clone(),
                provenance: json!({}),
                rejections: json!([]),
            },
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!(generation, a.generation + 1);
    // A diff based on the old generation loses.
    let err = store
        .update_agent_document(
            a.id,
            a.generation,
            &ReportedDocument {
                reported: json!({}),
                document: json!({}),
                provenance: json!({}),
                rejections: json!([]),
            },
            T0 + 2,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::GenerationMismatch { held, expected } if held == generation && expected == a.generation),
        "{err:?}"
    );
    let stored = store.get_agent(a.id).await.unwrap();
    assert_eq!(stored.document, doc);
    assert_eq!(stored.reported, doc);

    let overridden = store
        .set_operator_overrides(
            a.id,
            &json!({"tags": ["blessed"]}),
            &json!({"tags": ["linux", "gpu", "blessed"]}),
            &json!({"tags": "operator"}),
            T0 + 3,
        )
        .await
        .unwrap();
    assert_eq!(overridden.generation, generation + 1);
    assert_eq!(overridden.operator_overrides, json!({"tags": ["blessed"]}));
    assert_eq!(overridden.reported, doc);
}

async fn status_drain_touch_and_list(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let a = agent(store, "ns", "a", 1).await;
    let b = agent(store, "ns", "b", 1).await;
    let c = agent(store, "ns", "c", 1).await;
    let reasons = vec!["capability ai.llm unhealthy".to_owned()];
    assert!(
        store
            .set_agent_status(
                a.id,
                AgentStatus::Degraded,
                &reasons,
                Some(a.session_epoch),
                T0
            )
            .await
            .unwrap()
    );
    // A stale session may not change the status.
    assert!(
        !store
            .set_agent_status(
                a.id,
                AgentStatus::Offline,
                &[],
                Some(a.session_epoch + 1),
                T0
            )
            .await
            .unwrap()
    );
    let stored = store.get_agent(a.id).await.unwrap();
    assert_eq!(stored.status, AgentStatus::Degraded);
    assert_eq!(stored.status_reasons, reasons);

    let drained = store
        .set_agent_drained(b.id, true, None, None, T0)
        .await
        .unwrap();
    assert!(drained.drained);
    assert_eq!(drained.status, AgentStatus::Draining);
    assert_eq!(drained.status_reasons, ["drained by operator"]);
    // Re-registering or reporting ready keeps the drain.
    assert_eq!(
        agent(store, "ns", "b", 1).await.status,
        AgentStatus::Draining
    );
    store
        .set_agent_status(b.id, AgentStatus::Ready, &[], None, T0)
        .await
        .unwrap();
    assert_eq!(
        store.get_agent(b.id).await.unwrap().status,
        AgentStatus::Draining
    );
    let undrained = store
        .set_agent_drained(b.id, false, None, None, T0)
        .await
        .unwrap();
    assert_eq!(undrained.status, AgentStatus::Ready);

    store.touch_agent(c.id, T0 + 5_000).await.unwrap();
    assert_eq!(
        store.get_agent(c.id).await.unwrap().last_seen_at_ms,
        T0 + 5_000
    );
    // A touch older than the last one (another replica's, late) keeps it,
    // and a listing reads it as a lookup does.
    store.touch_agent(c.id, T0 + 4_000).await.unwrap();
    assert_eq!(
        store.get_agent(c.id).await.unwrap().last_seen_at_ms,
        T0 + 5_000
    );
    let listed = store.agents_of("ns").await.unwrap();
    let seen: Vec<i64> = listed.iter().map(|a| a.last_seen_at_ms).collect();
    assert_eq!(seen, [T0, T0, T0 + 5_000]);
    assert!(matches!(
        store.touch_agent(Uuid::now_v7(), T0).await,
        Err(Error::NotFound { .. })
    ));

    let (names, next) = names_page(store, 2, None).await;
    assert_eq!(names, ["a", "b"]);
    let (names, next) = names_page(store, 2, next).await;
    assert_eq!(names, ["c"]);
    assert_eq!(next, None);
    // Every id of the namespace at once, in the same (name) order.
    assert_eq!(store.agent_ids("ns").await.unwrap(), [a.id, b.id, c.id]);
    assert!(store.agent_ids("elsewhere").await.unwrap().is_empty());
    let (page, _) = store
        .list_agents(
            "ns",
            &[AgentStatus::Degraded],
            &Page {
                size: 10,
                after: None,
            },
            AgentParts::Listing,
        )
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    // A listing leaves the documents out and keeps the rest; matching reads
    // the merged document only.
    let full = store.get_agent(page[0].id).await.unwrap();
    assert_ne!(full.document, serde_json::Value::Null);
    assert_eq!(page[0].document, serde_json::Value::Null);
    assert_eq!(page[0].provenance, serde_json::Value::Null);
    let page_rejections = page[0].rejections.clone();
    assert_eq!(
        (
            page[0].status,
            page[0].capacity,
            &page[0].labels,
            page[0].generation
        ),
        (full.status, full.capacity, &full.labels, full.generation)
    );
    let page = Page {
        size: 10,
        after: None,
    };
    let (matching, _) = store
        .list_agents("ns", &[AgentStatus::Degraded], &page, AgentParts::Matching)
        .await
        .unwrap();
    assert_eq!(matching[0].document, full.document);
    assert_eq!(matching[0].reported, serde_json::Value::Null);
    assert_eq!(page_rejections, full.rejections);
}

/// The names on a page of `ns`'s agents (every status), and the cursor
/// after it.
async fn names_page(
    store: &dyn Store,
    size: u32,
    after: Option<String>,
) -> (Vec<String>, Option<String>) {
    let (page, next) = store
        .list_agents("ns", &[], &Page { size, after }, AgentParts::Full)
        .await
        .unwrap();
    (page.into_iter().map(|a| a.name).collect(), next)
}

/// An operator's drain reason stands while the drained agent reports
/// itself ready or degraded: the first heartbeat after a drain replaced it
/// with the agent's own reasons (none, for a healthy agent), so the console
/// and `get-agent` showed DRAINING with no reason a moment later.
async fn a_drain_keeps_its_reason_while_the_agent_reports_up(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let a = agent(store, "ns", "a", 1).await;
    store
        .set_agent_drained(a.id, true, Some("maintenance".into()), None, T0)
        .await
        .unwrap();
    let low = ["low on memory".to_owned()];
    for (status, reasons) in [
        (AgentStatus::Ready, &[][..]),
        (AgentStatus::Degraded, &low[..]),
    ] {
        store
            .set_agent_status(a.id, status, reasons, Some(a.session_epoch), T0 + 1)
            .await
            .unwrap();
        let stored = store.get_agent(a.id).await.unwrap();
        assert_eq!(stored.status, AgentStatus::Draining, "after {status:?}");
        assert_eq!(stored.status_reasons, ["maintenance"], "after {status:?}");
    }
    let undrained = store
        .set_agent_drained(a.id, false, None, None, T0 + 2)
        .await
        .unwrap();
    // Ready until the agent's next heartbeat says otherwise.
    assert_eq!(undrained.status, AgentStatus::Ready);
    assert!(undrained.status_reasons.is_empty());
}

async fn a_session_readies_its_agent_and_gets_it_as_stored(fx: &mut Fixture) {
    let store = fx.store.as_ref();
    let a = agent(store, "ns", "a", 2).await;
    let reasons = vec!["went away".to_owned()];
    store
        .set_agent_status(a.id, AgentStatus::Offline, &reasons, None, T0)
        .await
        .unwrap();
    let ready = store
        .ready_for_session(a.id, a.session_epoch, T0 + 5)
        .await
        .unwrap()
        .expect("the current epoch readies the agent");
    assert_eq!(ready.status, AgentStatus::Ready);
    assert!(ready.status_reasons.is_empty());
    // What it returns is the whole record as stored, documents included.
    assert_eq!(ready, store.get_agent(a.id).await.unwrap());
    assert_eq!(ready.document, a.document);

    // A session of an epoch the agent has registered past changes nothing
    // (the agent is left OFFLINE, so a READY written anyway would show).
    let again = agent(store, "ns", "a", 2).await;
    assert_eq!(again.session_epoch, a.session_epoch + 1);
    store
        .set_agent_status(a.id, AgentStatus::Offline, &reasons, None, T0 + 6)
        .await
        .unwrap();
    let before = store.get_agent(a.id).await.unwrap();
    assert!(
        store
            .ready_for_session(a.id, a.session_epoch, T0 + 7)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(store.get_agent(a.id).await.unwrap(), before);
    assert!(
        store
            .ready_for_session(Uuid::now_v7(), 1, T0 + 7)
            .await
            .unwrap()
            .is_none()
    );

    // A drained agent comes back DRAINING, its reason kept.
    store
        .set_agent_drained(a.id, true, Some("maintenance".into()), None, T0 + 8)
        .await
        .unwrap();
    let draining = store
        .ready_for_session(a.id, again.session_epoch, T0 + 9)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(draining.status, AgentStatus::Draining);
    assert_eq!(draining.status_reasons, ["maintenance"]);
}
