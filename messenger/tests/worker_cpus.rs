//! `worker_cpus` pins each worker thread to its CPU. A test binary of its
//! own: it looks at every thread of the process, and no other test may
//! start workers meanwhile.

mod common;

use std::collections::BTreeMap;
use std::fs;

/// This process's threads named `msgr-worker-*`, with the CPUs each may
/// run on (`Cpus_allowed_list`, as the kernel writes it).
fn worker_masks() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for task in fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("task").path();
        let Ok(name) = fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        let name = name.trim().to_string();
        if !name.starts_with("msgr-worker-") {
            continue;
        }
        let status = fs::read_to_string(dir.join("status")).unwrap_or_default();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|m| m.trim().to_string())
            .unwrap_or_default();
        out.insert(name, mask);
    }
    out
}

#[test]
fn each_worker_runs_on_its_cpu_round_robin() {
    let first = *msgr::allowed_cpus().first().expect("a CPU to run on");
    let mut cfg = common::fast_config();
    cfg.set("workers", "3").unwrap();
    cfg.set("worker_cpus", &first.to_string()).unwrap();
    let mut m = common::server(cfg, common::Recorder::new());
    // Every worker pins itself first thing; give them a moment to start.
    let cpu = first.to_string();
    let pinned = common::wait_until(std::time::Duration::from_secs(5), || {
        let masks = worker_masks();
        masks.len() == 3 && masks.values().all(|m| *m == cpu)
    });
    let masks = worker_masks();
    m.shutdown(std::time::Duration::from_secs(5));
    assert!(pinned, "workers' CPUs: {masks:?}, want all on {cpu}");
}
