//! Hot reload over real gRPC: every way users change rules takes effect, counters of unchanged
//! rules survive, a broken edit keeps the old rules and is reported.

use crate::common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::{Code, TestServer, code, request, start, start_at};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_server::clock::monotonic;
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

/// The `/rlconfig` report (what the last load said).
async fn rlconfig(s: &TestServer) -> serde_json::Value {
    reqwest::get(s.http("/rlconfig"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn metric(s: &TestServer, name: &str) -> u64 {
    common::metrics::scrape_count(&s.http("/metrics"), name).await
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
    common::wait::eventually("the broken edit is noticed", || async {
        metric(&s, "ratelimit_service_config_load_error").await > 0
    })
    .await;
    assert_eq!(
        limit_of(s.client.clone(), "a").await,
        Some(5),
        "old rules still in force"
    );
    let report = rlconfig(&s).await;
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
    let report = rlconfig(&s).await;
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

/// Asserts that `name` is still `expected` once the server has read the rules files after
/// everything done to them so far ([`settle`]).
async fn stays_at(s: &TestServer, name: &str, expected: u64) {
    let metrics = s.http("/metrics");
    settle(s.dir.path(), &metrics).await;
    assert_eq!(metric(s, name).await, expected, "{name} changed");
}

/// Waits until the server has read the rules files after everything done to `dir` so far: writes
/// a file that is not a rules file (an event the watcher acts on, changing no rule) and waits for
/// the check it causes. Events are taken in order, so any reload earlier ones caused is over.
async fn settle(dir: &Path, metrics: &str) {
    let before = common::metrics::scrape_count(metrics, CHECKS).await;
    fs::write(dir.join("settle.txt"), before.to_string()).unwrap();
    common::wait::eventually("the rules files are read again", || async {
        common::metrics::scrape_count(metrics, CHECKS).await > before
    })
    .await;
}

const SUCCESS: &str = "ratelimit_service_config_load_success";
const ERROR: &str = "ratelimit_service_config_load_error";
const CHECKS: &str = "ratelimit_rules_checks";

/// What `cat`, `ls -l`, editors opening a file and log shippers do to the rules directory.
fn read_and_stat(dir: &Path) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let _ = fs::metadata(&path).unwrap();
        let _ = fs::read(&path).unwrap();
    }
}

#[tokio::test]
async fn reading_and_stating_the_files_never_reloads() {
    let s = start(&[("a.yaml", &rules("a", 5)), ("b.yaml", &rules("b", 5))]).await;
    assert_eq!(metric(&s, SUCCESS).await, 1);
    let started = monotonic();
    while started.elapsed() < std::time::Duration::from_secs(2) {
        read_and_stat(s.dir.path());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stays_at(&s, SUCCESS, 1).await;
    assert_eq!(metric(&s, ERROR).await, 0);
}

#[tokio::test]
async fn touching_or_rewriting_identical_bytes_does_not_count_as_a_change() {
    let mut s = start(&[("a.yaml", &rules("a", 5)), ("b.yaml", &rules("b", 5))]).await;
    let path = s.dir.path().join("a.yaml");
    // touch: a new modification time, same bytes.
    let file = fs::File::options().append(true).open(&path).unwrap();
    let modified = file.metadata().unwrap().modified().unwrap();
    file.set_modified(modified + std::time::Duration::from_secs(60))
        .unwrap();
    // Rewritten in place, and by write-then-rename, with the same bytes.
    fs::write(&path, rules("a", 5)).unwrap();
    let tmp = s.dir.path().join(".a.yaml.tmp");
    fs::write(&tmp, rules("a", 5)).unwrap();
    fs::rename(&tmp, &path).unwrap();
    stays_at(&s, SUCCESS, 1).await;
    // A direct reload of identical files is a no-op too, and says so.
    let report = s.server.reloader.reload().expect("valid rules");
    assert!(report.summary.contains("unchanged"), "{}", report.summary);
    assert_eq!(metric(&s, SUCCESS).await, 1);
    // A real change still counts, once.
    fs::write(s.dir.path().join("b.yaml"), rules("b", 6)).unwrap();
    wait_for_limit(&mut s, "b", Some(6)).await;
    stays_at(&s, SUCCESS, 2).await;
}

#[tokio::test]
async fn one_edit_gives_exactly_one_reload() {
    let mut s = start(&[("a.yaml", &rules("a", 5))]).await;
    fs::write(s.dir.path().join("a.yaml"), rules("a", 9)).unwrap();
    wait_for_limit(&mut s, "a", Some(9)).await;
    stays_at(&s, SUCCESS, 2).await;
    // Reading it afterwards changes nothing.
    read_and_stat(s.dir.path());
    stays_at(&s, SUCCESS, 2).await;
}

#[tokio::test]
async fn two_servers_on_one_directory_stay_quiet() {
    let first = start(&[("a.yaml", &rules("a", 5))]).await;
    let second = {
        let mut settings =
            ratelimit_server::settings::ServeSettings::for_tests(first.dir.path().to_path_buf());
        settings.shutdown_delay = std::time::Duration::ZERO;
        let clock = ratelimit_server::clock::ManualClock::new(common::START);
        ratelimit_server::server::start(&settings, std::sync::Arc::new(clock))
            .await
            .expect("second server starts")
    };
    let second_metrics = format!("http://{}/metrics", second.http_addr);
    let second_metric = |name: &'static str| common::metrics::scrape_count(&second_metrics, name);
    read_and_stat(first.dir.path());
    stays_at(&first, SUCCESS, 1).await;
    assert_eq!(second_metric(SUCCESS).await, 1, "second server reloaded");
    // An edit reloads each once.
    fs::write(first.dir.path().join("a.yaml"), rules("a", 6)).unwrap();
    common::wait::eventually("both servers see the edit", || async {
        metric(&first, SUCCESS).await >= 2 && second_metric(SUCCESS).await >= 2
    })
    .await;
    stays_at(&first, SUCCESS, 2).await;
    assert_eq!(
        second_metric(SUCCESS).await,
        2,
        "second server kept reloading"
    );
    second.shutdown_after(std::time::Duration::ZERO).await;
}

/// Replaces `path`'s content at once: `text` written to a hidden file beside it (which the
/// reloader does not read), then renamed over it.
fn replace_whole(path: &Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_broken_file_is_counted_once_and_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), rules("a", 5)).unwrap();
    let mut served = common::process::Served::start(dir.path(), &[]);
    served.wait_ready().await;
    let broken = rules("a", 5).replace("requests_per_unit", "request_per_unit");
    // Each edit lands whole (written beside, then renamed): written in place, a loaded CI machine
    // can stall the writer between truncating and writing for longer than the reload's debounce,
    // and the reloader rightly refuses the empty file it sees meanwhile, a second error.
    replace_whole(&dir.path().join("a.yaml"), &broken);
    served.wait_for_metric(ERROR, 1).await;
    read_and_stat(dir.path());
    settle(dir.path(), &format!("{}/metrics", served.http)).await;
    assert_eq!(served.metric(ERROR).await, 1, "counted once");
    assert_eq!(
        served.log_lines("request_per_unit"),
        1,
        "logged once:\n{}",
        served.log()
    );
    // A second, different broken edit is a new error.
    replace_whole(
        &dir.path().join("a.yaml"),
        &broken.replace("hour", "fortnight"),
    );
    served.wait_for_metric(ERROR, 2).await;
    settle(dir.path(), &format!("{}/metrics", served.http)).await;
    assert_eq!(served.metric(ERROR).await, 2);
    assert_eq!(served.metric(SUCCESS).await, 1);
}

#[tokio::test]
async fn deleting_every_file_allows_everything_with_a_warning() {
    let mut s = start(&[("a.yaml", &rules("a", 5))]).await;
    fs::remove_file(s.dir.path().join("a.yaml")).unwrap();
    wait_for_limit(&mut s, "a", None).await;
    let report = rlconfig(&s).await;
    let summary = report["last_load"]["summary"].as_str().unwrap();
    let warning = format!(
        "no rules files in {}: every request is allowed",
        s.dir.path().display()
    );
    assert!(summary.contains(&warning), "{summary}");
}

#[tokio::test]
async fn a_rules_file_under_another_name_is_said_not_read_until_renamed() {
    // envoyproxy/ratelimit reads every file of its directory; here only *.yaml and *.yml are.
    let mut s = start(&[
        ("a.yaml", &rules("a", 5)),
        ("ratelimit.conf", &rules("b", 7)),
    ])
    .await;
    let said = format!(
        "1 file(s) in {} not read, as only *.yaml and *.yml files are rules files here \
         (envoyproxy/ratelimit reads every file): ratelimit.conf",
        s.dir.path().display()
    );
    let summary = rlconfig(&s).await["last_load"]["summary"].to_string();
    assert!(summary.contains(&said), "{summary}");
    assert_eq!(limit_of(s.client.clone(), "b").await, None);
    let dir = s.dir.path().to_owned();
    fs::rename(dir.join("ratelimit.conf"), dir.join("ratelimit.yaml")).unwrap();
    wait_for_limit(&mut s, "b", Some(7)).await;
    let summary = rlconfig(&s).await["last_load"]["summary"].to_string();
    assert!(!summary.contains("not read"), "{summary}");
}

#[tokio::test]
async fn sighup_reads_the_rules_again_and_never_stops_the_server() {
    // Its default action ends a process on the spot; an operator sends it to have a server read
    // its configuration again (or because the filesystem does not report edits to the watcher).
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), rules("a", 5)).unwrap();
    let env = [("LOG_LEVEL", "debug".to_owned())];
    let mut served = common::process::Served::with_env(dir.path(), &env);
    served.wait_ready().await;
    let checks = served.metric(CHECKS).await;
    served.hang_up();
    served.wait_for_metric(CHECKS, checks + 1).await;
    assert_eq!(
        served.log_lines("SIGHUP: the rules files were read again"),
        1,
        "{}",
        served.log()
    );
    // LOG_LEVEL=debug is every crate of the server's (it was the binary's alone): the reload's
    // own debug line says the files were unchanged.
    assert_eq!(
        served.log_lines("rules files unchanged; nothing to do"),
        1,
        "{}",
        served.log()
    );
    served.hang_up();
    served.wait_for_metric(CHECKS, checks + 2).await;
    assert_eq!(limit_of(served.client().await, "a").await, Some(5));
    assert_eq!(
        served.metric(SUCCESS).await,
        1,
        "unchanged files: no new load"
    );
    served.terminate();
    assert!(served.wait_exit().success(), "{}", served.log());
}

#[tokio::test]
async fn a_rules_directory_deleted_and_made_again_is_watched_again() {
    // `rm -rf rules && cp -r new rules`: the same path, another directory. Its first rules came in
    // through the parent's watch; the edits after them went unseen.
    let mut s = start(&[("a.yaml", &rules("a", 5))]).await;
    let dir = s.dir.path().to_owned();
    fs::remove_dir_all(&dir).unwrap();
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("a.yaml"), rules("a", 6)).unwrap();
    wait_for_limit(&mut s, "a", Some(6)).await;
    fs::write(dir.join("a.yaml"), rules("a", 7)).unwrap();
    wait_for_limit(&mut s, "a", Some(7)).await;
}

#[tokio::test]
async fn a_relative_config_path_reloads() {
    // The server is a child process started in the directory's parent with `--config rules`.
    let root = tempfile::tempdir().unwrap();
    fs::create_dir(root.path().join("rules")).unwrap();
    fs::write(root.path().join("rules/a.yaml"), rules("a", 5)).unwrap();
    let mut served = common::process::Served::start_in(root.path(), Path::new("rules"), &[]);
    served.wait_ready().await;
    fs::write(root.path().join("rules/a.yaml"), rules("a", 6)).unwrap();
    served.wait_for_metric(SUCCESS, 2).await;
    fs::write(root.path().join("rules/a.yaml"), "not: [valid").unwrap();
    served.wait_for_metric(ERROR, 1).await;
}
