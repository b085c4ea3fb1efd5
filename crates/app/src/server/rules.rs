//! The first rules: the directory read now (invalid rules stop the start unless
//! `FORCE_START_WITHOUT_INITIAL_CONFIG`), or, with xDS, nothing yet and health held until the
//! client's first valid response.

use std::sync::Arc;

use crate::reload::Reloader;
use crate::settings::ServeSettings;
use crate::status::{LoadReport, ServerStatus};
use crate::xds::XdsConfig;
use ratelimit_core::clock::Clock;
use ratelimit_core::engine::Rules;
use ratelimit_core::metrics::Metrics;

use super::StartError;

/// The reloader of the rules directory, which installs each valid rule set into `engine`.
pub(super) fn rules_reloader(
    settings: &ServeSettings,
    engine: Arc<dyn Rules>,
    metrics: &Arc<Metrics>,
    status: &Arc<ServerStatus>,
    clock: &Arc<dyn Clock>,
) -> Arc<Reloader> {
    let reloader = Reloader::new(
        settings.config.clone(),
        settings.rules_files.caps(),
        engine,
        metrics.clone(),
        status.clone(),
        clock.clone(),
    );
    Arc::new(reloader.with_merged_domains(settings.rules_files.merge_domain_config))
}

/// Where the rules come from (`Some`: an xDS server, checked now) and the first load's summary
/// to log.
pub(super) fn first_rules(
    settings: &ServeSettings,
    reloader: &Reloader,
    status: &ServerStatus,
) -> Result<(Option<XdsConfig>, String), StartError> {
    let xds = settings.xds.config().map_err(StartError::Xds)?;
    if let Some(xds) = &xds {
        xds.check().map_err(StartError::Xds)?;
    }
    let summary = match &xds {
        None => load_first_rules(settings, reloader)?,
        Some(xds) => xds_first_rules(settings, xds, status),
    };
    Ok((xds, summary))
}

/// Loads the rules directory for the first time and returns the summary to log. Invalid rules
/// stop the start, unless `FORCE_START_WITHOUT_INITIAL_CONFIG` says to serve with none.
fn load_first_rules(settings: &ServeSettings, reloader: &Reloader) -> Result<String, StartError> {
    match reloader.reload() {
        Ok(loaded) => Ok(loaded.summary),
        // The reference's FORCE_START_WITHOUT_INITIAL_CONFIG: serve with no rules (the error is
        // logged, counted and on /rlconfig) until a reload brings valid ones.
        Err(errors) if settings.force_start_without_initial_config => {
            tracing::error!(
                dir = %settings.config.display(),
                "invalid rules; starting with none in force (FORCE_START_WITHOUT_INITIAL_CONFIG):\n{errors}"
            );
            Ok("no rules in force (the rules are invalid)".to_owned())
        }
        Err(errors) => Err(StartError::Rules {
            dir: settings.config.display().to_string(),
            errors,
        }),
    }
}

/// With rules from xDS: nothing is read now (the client task subscribes once the listeners are
/// up); without `FORCE_START_WITHOUT_INITIAL_CONFIG`, health fails until the first valid
/// response. Returns the summary to log.
fn xds_first_rules(settings: &ServeSettings, xds: &XdsConfig, status: &ServerStatus) -> String {
    status.set_last_load(LoadReport {
        summary: format!(
            "waiting for the first response of the xDS server {}",
            xds.authority
        ),
        source: "xds".into(),
        ..LoadReport::default()
    });
    if settings.force_start_without_initial_config {
        format!(
            "none yet: from the xDS server {} (serving before the first response: \
             FORCE_START_WITHOUT_INITIAL_CONFIG)",
            xds.authority
        )
    } else {
        status.set_awaiting_rules(true);
        format!(
            "none yet: from the xDS server {} (health NOT_SERVING until the first valid response)",
            xds.authority
        )
    }
}
