//! Exactness under concurrency over real gRPC: racing clients never get more than the limit.

use crate::common;

use common::{Code, code, request, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_clients_on_one_key_get_exactly_the_limit() {
    let rules = "domain: race\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";
    let s = start(&[("race.yaml", rules)]).await;
    for key in ["k", "b"] {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let mut client = s.client.clone();
                tokio::spawn(async move {
                    let mut ok = 0;
                    for _ in 0..100 {
                        let r = client
                            .should_rate_limit(request("race", &[&[(key, "same")]]))
                            .await
                            .unwrap();
                        if code(r.into_inner().overall_code) == Code::Ok {
                            ok += 1;
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        assert_eq!(admitted, 1000, "algorithm of key {key}");
    }
}
