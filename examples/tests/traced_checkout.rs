//! The traced checkout exports one trace from the request to the receiver, and the relay's
//! publish span links to it.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_continues_the_request_trace_and_publish_links_to_it() {
    let summary = outbox_examples::traced_checkout::run()
        .await
        .expect("traced checkout");
    assert!(summary.receiver_in_request_trace, "{summary}");
    assert!(summary.publish_linked_to_request, "{summary}");
    assert_eq!(summary.lost, 0, "{summary}");
    // request, batch, publish, receiver (claim and complete are debug spans: also exported
    // by this subscriber, which records every level).
    assert!(summary.spans >= 4, "{summary}");
}
