use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use prost::Message;

use super::*;
use ratelimit_core::config::{self, DomainConfig, MetaValue, RateLimitSpec, Unit};

fn any(config: &RateLimitConfig) -> Any {
    Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }
}

fn limit(unit: RateLimitUnit, rpu: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: rpu,
        ..Default::default()
    })
}

fn descriptor(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit,
        ..Default::default()
    }
}

fn resource(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: domain.into(),
        descriptors,
    }
}

/// Decodes, renders and validates, as the client does; errors as the NACK tells them.
fn load(resources: &[RateLimitConfig], merge: bool) -> Result<Vec<DomainConfig>, Vec<String>> {
    let anys: Vec<Any> = resources.iter().map(any).collect();
    let documents = decode(&anys)?;
    config::parse_files_merging(&texts(&documents), merge).map_err(|e| describe_all(&e, &documents))
}

#[test]
fn every_field_of_a_resource_becomes_the_rule_a_file_would_make() {
    let mut metadata = BTreeMap::new();
    metadata.insert(
        "tier".to_owned(),
        Value {
            kind: Some(Kind::StringValue("gold".into())),
        },
    );
    metadata.insert(
        "weight".to_owned(),
        Value {
            kind: Some(Kind::NumberValue(2.5)),
        },
    );
    let mut child = descriptor("path", "/api/*", limit(RateLimitUnit::Minute, 10));
    child.shadow_mode = true;
    child.detailed_metric = true;
    child.quota_mode = true;
    child.metadata = Some(Struct {
        fields: metadata.into_iter().collect(),
    });
    let mut user = descriptor("user", "", limit(RateLimitUnit::Week, 3));
    if let Some(p) = user.rate_limit.as_mut() {
        p.name = "weekly".into();
        p.replaces = vec![RateLimitReplace {
            name: "other".into(),
        }];
    }
    user.descriptors = vec![child];
    let free = descriptor(
        "plan",
        "free \"quoted\"\nline",
        Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        }),
    );
    let configs = load(&[resource("r1", "eg/default", vec![user, free])], false).unwrap();
    assert_eq!(configs.len(), 1);
    let c = &configs[0];
    assert_eq!(c.domain, "eg/default");
    assert_eq!(c.source.display().to_string(), "xds:RateLimitConfig/r1");
    let user = &c.descriptors[0];
    assert_eq!((user.key.as_str(), user.value.as_deref()), ("user", None));
    let Some(RateLimitSpec::Limited(limits)) = &user.rate_limit else {
        panic!("{:?}", user.rate_limit);
    };
    assert_eq!(limits[0].unit, Unit::Week);
    assert_eq!(limits[0].requests_per_unit, 3);
    assert_eq!(limits[0].name.as_deref(), Some("weekly"));
    assert_eq!(limits[0].replaces, ["other"]);
    let child = &user.descriptors[0];
    assert_eq!(child.value.as_deref(), Some("/api/*"));
    assert!(child.shadow_mode && child.detailed_metric && child.quota_mode);
    assert_eq!(
        child.metadata,
        Some(vec![
            ("tier".to_owned(), MetaValue::String("gold".into())),
            ("weight".to_owned(), MetaValue::Number("2.5".into())),
        ])
    );
    let free = &c.descriptors[1];
    assert_eq!(free.value.as_deref(), Some("free \"quoted\"\nline"));
    assert!(matches!(
        free.rate_limit,
        Some(RateLimitSpec::Unlimited { .. })
    ));
}

#[test]
fn an_invalid_field_is_named_by_resource_and_path() {
    let mut parent = descriptor("a", "1", None);
    parent.descriptors = vec![
        descriptor("b", "ok", limit(RateLimitUnit::Second, 1)),
        descriptor("b", "bad", limit(RateLimitUnit::Unknown, 5)),
    ];
    let errors = load(&[resource("routes", "d", vec![parent])], false).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "RateLimitConfig 'routes': descriptors[0].descriptors[1].rate_limit.unit: \
             invalid rate limit unit 'UNKNOWN'"
        ),
        "{errors:?}"
    );
}

#[test]
fn unlimited_with_a_unit_and_an_unknown_unit_number_are_refused() {
    let unlimited_with_unit = descriptor(
        "k",
        "",
        Some(RateLimitPolicy {
            unlimited: true,
            unit: RateLimitUnit::Hour as i32,
            ..Default::default()
        }),
    );
    let unknown = descriptor(
        "j",
        "",
        Some(RateLimitPolicy {
            unit: 42,
            requests_per_unit: 1,
            ..Default::default()
        }),
    );
    let errors = load(
        &[resource("x", "d", vec![unlimited_with_unit, unknown])],
        false,
    )
    .unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].starts_with("RateLimitConfig 'x': descriptors[0].rate_limit.unit: "));
    assert!(errors[0].contains("unlimited"), "{errors:?}");
    assert!(errors[1].starts_with("RateLimitConfig 'x': descriptors[1].rate_limit.unit: "));
    assert!(errors[1].contains("'42'"), "{errors:?}");
}

#[test]
fn an_empty_key_or_domain_is_refused_with_its_field() {
    let errors = load(&[resource("e", "", vec![descriptor("", "v", None)])], false).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("RateLimitConfig 'e': domain: ")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("RateLimitConfig 'e': descriptors[0].key: ")),
        "{errors:?}"
    );
}

#[test]
fn two_resources_of_one_domain_need_merge_domain_config() {
    let a = resource(
        "a",
        "d",
        vec![descriptor("k", "1", limit(RateLimitUnit::Second, 1))],
    );
    let b = resource(
        "b",
        "d",
        vec![descriptor("k", "2", limit(RateLimitUnit::Second, 2))],
    );
    let errors = load(&[a.clone(), b.clone()], false).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("RateLimitConfig 'b': domain: duplicate domain 'd'"));
    assert!(
        errors[0].contains("already defined in RateLimitConfig 'a'"),
        "{errors:?}"
    );
    // A name that prefixes another's is not mistaken for it.
    let ab = resource(
        "ab",
        "d",
        vec![descriptor("k", "3", limit(RateLimitUnit::Second, 3))],
    );
    let first = resource(
        "a",
        "d",
        vec![descriptor("k", "4", limit(RateLimitUnit::Second, 4))],
    );
    let errors = load(&[first, ab.clone()], false).unwrap_err();
    assert!(
        errors[0].starts_with("RateLimitConfig 'ab': domain: "),
        "{errors:?}"
    );
    assert!(
        errors[0].contains("already defined in RateLimitConfig 'a'"),
        "{errors:?}"
    );
    let merged = load(&[a, b], true).unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].descriptors.len(), 2);
}

#[test]
fn bytes_that_are_not_a_rate_limit_config_are_named_by_position() {
    let good = any(&resource("g", "d", Vec::new()));
    let wrong_type = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    let garbage = Any {
        type_url: TYPE_URL.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    let errors = decode(&[good.clone(), wrong_type, garbage]).unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].starts_with("resource #1: type 'type.googleapis.com/envoy.config.cluster"));
    assert!(errors[1].starts_with("resource #2: not a RateLimitConfig"));
    assert_eq!(decode(&[good]).unwrap().len(), 1);
}

fn nested(levels: usize) -> RateLimitDescriptor {
    let mut d = descriptor("k", "", None);
    for _ in 1..levels {
        let mut parent = descriptor("k", "", None);
        parent.descriptors = vec![d];
        d = parent;
    }
    d
}

#[test]
fn descriptors_nested_too_deep_are_refused_before_rendering() {
    let errors = decode(&[any(&resource("deep", "d", vec![nested(80)]))]).unwrap_err();
    assert_eq!(
        errors,
        ["RateLimitConfig 'deep': descriptors nested deeper than 64 levels"]
    );
    // Deeper than protobuf decoding goes: one short line, not one per level.
    let errors = decode(&[any(&resource("deeper", "d", vec![nested(200)]))]).unwrap_err();
    assert_eq!(
        errors,
        ["resource #0: not a RateLimitConfig: recursion limit reached"]
    );
}

#[test]
fn an_empty_resource_set_and_an_empty_domain_are_valid() {
    assert_eq!(load(&[], false).unwrap(), Vec::new());
    let configs = load(&[resource("empty", "d", Vec::new())], false).unwrap();
    assert!(configs[0].descriptors.is_empty());
}
