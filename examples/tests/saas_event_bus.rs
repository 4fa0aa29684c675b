//! The SaaS event bus example runs end to end against PostgreSQL, Redis, RabbitMQ,
//! Kafka and SQS (`scripts/services.sh`): one route, Redis then HTTP then AMQP then Kafka
//! then SQS by configuration only.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_route_swapped_from_redis_to_http_to_amqp_to_kafka_to_sqs_by_configuration() {
    let summary = outbox_examples::saas_event_bus::run()
        .await
        .expect("saas_event_bus");
    assert_eq!(
        summary.to_string(),
        "redis_events=9 http_events=9 amqp_events=9 kafka_events=9 sqs_events=9 duplicates_dropped=1 out_of_order=0 lost=0"
    );
}
