//! Dead letters: listed, counted, replayed and discarded by filter.

use super::{StoreHarness, counts, request};
use crate::message::NewMessage;
use crate::store::{Completion, DeadLetterFilter, DeadLetters, Store};

/// Dead letters can be listed, counted, replayed and discarded by filter; only matches are touched.
pub async fn dead_letters_list_replay_discard<H: StoreHarness>(h: &H) {
    let specs = [
        ("sms", "order.paid", "400 bad phone"),
        ("sms", "order.shipped", "400 unknown template"),
        ("email", "order.paid", "550 mailbox unavailable"),
        ("email", "order.paid", "400 bad address"),
    ];
    let messages: Vec<NewMessage> = specs
        .iter()
        .map(|(d, e, _)| NewMessage::builder(*d, *e).json(&1).build().expect("valid"))
        .collect();
    let ids: Vec<_> = messages.iter().map(NewMessage::id).collect();
    h.enqueue(messages).await.expect("enqueue");
    let store = h.store();
    let claim = store.claim(&request(10)).await.expect("claim");
    let deaths: Vec<_> = ids
        .iter()
        .zip(specs)
        .map(|(id, (_, _, why))| Completion::dead(*id, why))
        .collect();
    store
        .complete(claim.lease.token, &deaths)
        .await
        .expect("complete");

    let all = store
        .list_dead(&DeadLetterFilter::all(), 10)
        .await
        .expect("list");
    assert_eq!(
        all.iter().map(|d| d.message.id).collect::<Vec<_>>(),
        ids,
        "oldest first"
    );
    let limited = store
        .list_dead(&DeadLetterFilter::all(), 2)
        .await
        .expect("list");
    assert_eq!(limited.len(), 2, "limit applies");
    let next_page = DeadLetterFilter::all().after_id(limited[1].message.id);
    assert_eq!(
        store
            .list_dead(&next_page, 10)
            .await
            .expect("list")
            .iter()
            .map(|d| d.message.id)
            .collect::<Vec<_>>(),
        ids[2..],
        "the next page starts after the last id listed"
    );
    let sms = DeadLetterFilter::all().destination("sms");
    assert_eq!(store.list_dead(&sms, 10).await.expect("list").len(), 2);
    let paid_email = DeadLetterFilter::all()
        .destination("email")
        .event_type("order.paid")
        .error_contains("400");
    let found = store.list_dead(&paid_email, 10).await.expect("list");
    assert_eq!(
        found.iter().map(|d| d.message.id).collect::<Vec<_>>(),
        vec![ids[3]]
    );
    let by_id = DeadLetterFilter::all().ids([ids[1]]);
    assert_eq!(
        store.list_dead(&by_id, 10).await.expect("list")[0]
            .message
            .id,
        ids[1]
    );
    let future = DeadLetterFilter::all()
        .created_between(Some(chrono::Utc::now() + chrono::Duration::days(365)), None);
    assert!(
        store.list_dead(&future, 10).await.expect("list").is_empty(),
        "time range applies"
    );
    let everything = DeadLetterFilter::all();
    for (filter, listed) in [
        (&everything, 4),
        (&sms, 2),
        (&paid_email, 1),
        (&by_id, 1),
        (&future, 0),
        (&next_page, 2),
    ] {
        assert_eq!(
            store.count_dead(filter).await.expect("count"),
            listed,
            "count_dead counts what list_dead lists: {filter:?}"
        );
    }

    assert_eq!(
        store.replay_dead(&sms).await.expect("replay"),
        2,
        "replay moves exactly the matches"
    );
    assert_eq!(counts(h, "sms").await, (2, 0, 0, 0));
    assert_eq!(counts(h, "email").await, (0, 0, 0, 2));
    let replayed = store.claim(&request(10)).await.expect("claim");
    assert_eq!(
        replayed.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[..2]
    );
    assert!(
        replayed.messages.iter().all(|m| m.attempts == 1),
        "replay starts the attempts over"
    );

    assert_eq!(
        store.count_dead(&everything).await.expect("count"),
        2,
        "replayed rows are no longer counted"
    );
    let discard = DeadLetterFilter::all().error_contains("550");
    assert_eq!(store.discard_dead(&discard).await.expect("discard"), 1);
    assert_eq!(counts(h, "email").await, (0, 0, 0, 1));
    assert_eq!(
        store.discard_dead(&discard).await.expect("discard"),
        0,
        "nothing left to discard"
    );
}
