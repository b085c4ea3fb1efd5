//! Hot reload over real gRPC: every way users change rules takes effect, counters of unchanged
//! rules survive, a broken edit keeps the old rules and is reported.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::{Code, TestServer, code, request, start, start_at};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

fn rules(domain: &str, rpu: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {rpu}, algorithm: fixed_window}}\n"
    )
}

/// The limit a server reports for (domain, k=probe) without charging it, or None without a rule.
async fn limit_of(mut client: RateLimitServiceClient<Channel>, domain: &str) -> Option<u32> {
    let mut r = request(domain, &[&[("k", "probe")]]);
    r.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let response = client.should_rate_limit(r).await.ok()?.into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

async fn wait_for_limit(s: &mut TestServer, domain: &str, expected: Option<u32>) {
    let domain = domain.to_owned();
    s.eventually(&format!("{domain} limit {expected:?}"), |c| {
        let domain = domain.clone();
        async move { limit_of(c, &domain).await == expected }
    })
    .await;
}

async fn metric(s: &TestServer, name: &str) -> u64 {
    let text = reqwest::get(s.http("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test]
async fn in_place_edit_takes_effect_and_keeps_counters() {
    let mut s = start(&[("a.yaml", &rules("a", 5)), ("b.yaml", &rules("b", 5))]).await;
    assert_eq!(s.hit("a", &[("k", "x")]).await, (Code::Ok, 4));
    assert_eq!(s.hit("b", &[("k", "x")]).await, (Code::Ok, 4));
    fs::write(s.dir.path().join("b.yaml"), rules("b", 50)).unwrap();
    wait_for_limit(&mut s, "b", Some(50)).await;
    assert_eq!(
        s.hit("a", &[("k", "x")]).await,
        (Code::Ok, 3),
        "unchanged rule kept its count"
    );
    assert_eq!(
        s.hit("b", &[("k", "x")]).await,
        (Code::Ok, 48),
        "changed limit kept the consumed amount"
    );
}

#[tokio::test]
async fn write_to_temp_then_rename_takes_effect() {
    let mut s = start(&[("a.yaml", &rules("a", 5))]).await;
    let tmp = s.dir.path().join(".a.yaml.tmp");
    fs::write(&tmp, rules("a", 7)).unwrap();
    fs::rename(&tmp, s.dir.path().join("a.yaml")).unwrap();
    wait_for_limit(&mut s, "a", Some(7)).await;
}

#[tokio::test]
async fn adding_and_deleting_files_add_and_remove_domains() {
    let mut s = start(&[("a.yaml", &rules("a", 5))]).await;
    fs::create_dir(s.dir.path().join("team")).unwrap();
    fs::write(s.dir.path().join("team/b.yml"), rules("b", 9)).unwrap();
    wait_for_limit(&mut s, "b", Some(9)).await;
    fs::remove_file(s.dir.path().join("a.yaml")).unwrap();
    wait_for_limit(&mut s, "a", None).await;
    assert_eq!(limit_of(s.client.clone(), "b").await, Some(9));
}

fn configmap_version(root: &Path, version: &str, text: &str) {
    let dir = root.join(version);
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("a.yaml"), text).unwrap();
}

#[tokio::test]
async fn kubernetes_configmap_data_swap_takes_effect() {
    // Kubelet's layout: a.yaml -> ..data/a.yaml, ..data -> ..<timestamp>/, swapped by renaming a
    // new ..data_tmp symlink over ..data.
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("mount");
    fs::create_dir(&mount).unwrap();
    configmap_version(&mount, "..2026_11_30_01", &rules("a", 5));
    symlink("..2026_11_30_01", mount.join("..data")).unwrap();
    symlink("..data/a.yaml", mount.join("a.yaml")).unwrap();
    let mut s = start_at(dir, mount.clone(), |_| {}).await;
    assert_eq!(limit_of(s.client.clone(), "a").await, Some(5));
    assert_eq!(s.hit("a", &[("k", "x")]).await, (Code::Ok, 4));

    configmap_version(&mount, "..2026_11_30_02", &rules("a", 6));
    symlink("..2026_11_30_02", mount.join("..data_tmp")).unwrap();
    fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    fs::remove_dir_all(mount.join("..2026_11_30_01")).unwrap();
    wait_for_limit(&mut s, "a", Some(6)).await;
    assert_eq!(
        s.hit("a", &[("k", "x")]).await,
        (Code::Ok, 4),
        "6 - 2 hits: the count survived"
    );
}

#[tokio::test]
async fn directory_symlink_swap_takes_effect_repeatedly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    for (version, rpu) in [("v1", 5), ("v2", 6), ("v3", 7)] {
        fs::create_dir(root.join(version)).unwrap();
        fs::write(root.join(version).join("a.yaml"), rules("a", rpu)).unwrap();
    }
    symlink("v1", root.join("current")).unwrap();
    let mut s = start_at(dir, root.join("current"), |_| {}).await;
    assert_eq!(limit_of(s.client.clone(), "a").await, Some(5));
    for (version, rpu) in [("v2", 6), ("v3", 7)] {
        // ln -s vN tmp && mv -T tmp current
        symlink(version, root.join("tmp")).unwrap();
        fs::rename(root.join("tmp"), root.join("current")).unwrap();
        wait_for_limit(&mut s, "a", Some(rpu)).await;
    }
    // Edits inside the new target are seen too.
    fs::write(root.join("v3/a.yaml"), rules("a", 8)).unwrap();
    wait_for_limit(&mut s, "a", Some(8)).await;
}

#[tokio::test]
async fn a_broken_edit_keeps_the_old_rules_and_is_reported_until_fixed() {
    let mut s = start(&[("a.yaml", &rules("a", 5))]).await;
    assert_eq!(metric(&s, "ratelimit_service_config_load_success").await, 1);
    let broken = rules("a", 5).replace("requests_per_unit", "request_per_unit");
    fs::write(s.dir.path().join("a.yaml"), broken).unwrap();
    let started = std::time::Instant::now();
    while metric(&s, "ratelimit_service_config_load_error").await == 0 {
        assert!(
            started.elapsed().as_secs() < 3,
            "the broken edit was not noticed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        limit_of(s.client.clone(), "a").await,
        Some(5),
        "old rules still in force"
    );
    let report: serde_json::Value = reqwest::get(s.http("/rlconfig"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let last = &report["last_load"];
    assert_eq!(last["ok"], false);
    let errors: Vec<&str> = last["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("a.yaml:4:") && e.contains("unknown field 'request_per_unit'")),
        "{errors:?}"
    );
    assert_eq!(
        report["domains"][0]["domain"], "a",
        "the live rules are still listed"
    );

    fs::write(s.dir.path().join("a.yaml"), rules("a", 11)).unwrap();
    wait_for_limit(&mut s, "a", Some(11)).await;
    let report: serde_json::Value = reqwest::get(s.http("/rlconfig"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(report["last_load"]["ok"], true);
    assert_eq!(metric(&s, "ratelimit_service_config_load_success").await, 2);
}

#[tokio::test]
async fn unchanged_overall_answer_while_reloading() {
    let mut s = start(&[("a.yaml", &rules("a", 1000))]).await;
    let path = s.dir.path().join("a.yaml");
    let mut client = s.client.clone();
    let writer = tokio::spawn(async move {
        for i in 0..20 {
            fs::write(&path, rules("a", 1000 + i)).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    for _ in 0..200 {
        let r = client
            .should_rate_limit(request("a", &[&[("k", "y")]]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            code(r.overall_code),
            Code::Ok,
            "never an error or a gap during reloads"
        );
        assert!(r.statuses[0].current_limit.is_some());
    }
    writer.await.unwrap();
    wait_for_limit(&mut s, "a", Some(1019)).await;
}
