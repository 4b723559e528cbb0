//! The server under load, on loopback: many concurrent WebSocket sessions,
//! each playing a fixed schedule of seeds and actions, then every
//! session's trajectory checked against the same schedule run in-process.
//! Reports p50/p99 step latency (client round trip) and total steps/s.
//!
//! ```text
//! cargo bench -p ragen-serve --bench load                       # 1,000 sessions x 100 steps, Sokoban
//! cargo bench -p ragen-serve --bench load -- --sessions 200 --steps 50 --plugin target/plugins/frozenlake.wasm
//! ```
//!
//! Exits non-zero if a response is missing or a trajectory differs.

use anyhow::{Context, Result, bail};
use ragen_runtime::Plugin;
use ragen_serve::{ServeConfig, Server};
use ragen_test_fixtures::serve_load::{self as load, Schedule};
use std::path::PathBuf;
use std::sync::Arc;

struct Options {
    plugin: PathBuf,
    sessions: usize,
    steps: usize,
    threads: Option<usize>,
    settings: Vec<(String, String)>,
}

fn options() -> Result<Options> {
    let mut o = Options { plugin: ragen_test_fixtures::plugin("sokoban"), sessions: 1000, steps: 100, threads: None, settings: vec![] };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--plugin" => o.plugin = value()?.into(),
            "--sessions" => o.sessions = value()?.parse()?,
            "--steps" => o.steps = value()?.parse()?,
            "--threads" => o.threads = Some(value()?.parse()?),
            "--set" => {
                let kv = value()?;
                let (k, v) = kv.split_once('=').with_context(|| format!("--set {kv}: expected KEY=VALUE"))?;
                o.settings.push((k.into(), v.into()));
            }
            "--bench" => {}
            other => bail!("unknown argument {other}; use --plugin, --sessions, --steps, --threads, --set KEY=VALUE"),
        }
    }
    Ok(o)
}

fn main() -> Result<()> {
    let o = options()?;
    let plugin = Arc::new(Plugin::from_file(&o.plugin)?);
    let (info, spec) = plugin.describe(&o.settings)?;
    let num_actions = spec.action_names().len() as u32;
    if num_actions == 0 {
        bail!("{} takes text actions; the load schedule picks action ids", info.name);
    }
    let schedule = Schedule { sessions: o.sessions, steps: o.steps, seed_start: 0, num_actions };
    let mut config = ServeConfig { max_sessions: o.sessions, settings: o.settings.clone(), ..ServeConfig::default() };
    if let Some(t) = o.threads {
        config.threads = t;
    }
    let threads = config.threads;
    let server = Server::new(plugin.clone(), config)?;
    let stop = server.shutdown_token();
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let serving = tokio::spawn(server.serve(listener));
        let report = load::run(addr, schedule, None).await;
        stop.cancel();
        serving.await??;
        anyhow::Ok(report)
    })?;
    let expected = load::replay(plugin, &o.settings, schedule)?;

    let broken: Vec<_> = report.traces.iter().enumerate().filter_map(|(s, t)| t.as_ref().err().map(|e| (s, e))).collect();
    let differ = report.traces.iter().zip(&expected).filter(|(got, want)| got.as_ref().is_ok_and(|g| g != *want)).count();
    let failures: usize = expected.iter().map(|t| t.failures()).sum();
    println!("{}: {} sessions x {} steps over WebSocket on loopback, pool of {} threads", info.name, o.sessions, o.steps, threads);
    println!("  responses        {} of {} steps", report.step_latencies.len(), o.sessions * o.steps);
    println!("  sessions broken  {}", broken.len());
    println!(
        "  trajectories     {} equal to in-process, {differ} differ ({failures} env failures expected)",
        o.sessions - broken.len() - differ
    );
    println!("  step latency     p50 {:.2} ms, p99 {:.2} ms", ms(report.latency(50.0)), ms(report.latency(99.0)));
    println!("  throughput       {:.0} steps/s ({:.2} s)", report.steps_per_sec(), report.elapsed.as_secs_f64());
    println!(
        "{}",
        serde_json::json!({
            "plugin": info.name, "sessions": o.sessions, "steps": o.steps, "threads": threads,
            "responses": report.step_latencies.len(), "broken": broken.len(), "differ": differ,
            "p50_ms": ms(report.latency(50.0)), "p99_ms": ms(report.latency(99.0)), "steps_per_s": report.steps_per_sec(),
        })
    );
    if let Some((s, e)) = broken.first() {
        bail!("session {s} broke off: {e}");
    }
    if differ > 0 || report.step_latencies.len() != o.sessions * o.steps {
        bail!("{differ} trajectories differ from in-process, or responses are missing");
    }
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
