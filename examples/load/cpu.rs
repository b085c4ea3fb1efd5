//! CPU time of the processes a run measures (each server process, and redis-server when the run
//! started it), read from `/proc/PID/stat` at the end of the warm-up and at the end of the run:
//! the same window as the answers counted, so CPU per answer is comparable across servers whatever
//! their start-up or connection set-up cost.

use std::time::Instant;

use tokio::task::JoinHandle;

/// User + system CPU seconds process `pid` has used so far (`/proc/PID/stat`, fields 14 and 15,
/// in USER_HZ ticks of 1/100 s); 0 where there is no /proc.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (in parentheses, may hold spaces), utime is the 12th field.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: f64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// The processes whose CPU a run reads.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    /// The server process(es) answering the calls.
    pub servers: Vec<u32>,
    /// redis-server, when the run uses it and started it.
    pub redis: Option<u32>,
}

/// CPU seconds used within the measured window.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    pub server: f64,
    pub redis: Option<f64>,
}

impl Watched {
    fn read(&self) -> Window {
        Window {
            server: self.servers.iter().copied().map(cpu_seconds).sum(),
            redis: self.redis.map(cpu_seconds),
        }
    }

    /// The CPU the processes use between `from` and `to` (a task that sleeps until each).
    pub fn window(&self, from: Instant, to: Instant) -> JoinHandle<Window> {
        let watched = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(from.into()).await;
            let before = watched.read();
            tokio::time::sleep_until(to.into()).await;
            let after = watched.read();
            Window {
                server: after.server - before.server,
                redis: after.redis.zip(before.redis).map(|(a, b)| a - b),
            }
        })
    }
}
