//! Run commands inside a QEMU guest that has a real Linux RDMA stack.
//!
//! The development and CI machines have no RDMA-capable kernel, so RDMA tests
//! run in a throw-away TCG guest (docs/GUEST.md): Debian's kernel, Soft-RoCE
//! (`rxe0` on lo, `rxe1` on 198.51.100.1) and soft-iWARP (`siw0` on
//! 198.51.100.2), the host's root mounted read-only, so binaries built on the
//! host run as they are. `testsuite/guest/setup.sh` prepares and caches the
//! kernel and initramfs; [`GuestRunner::from_env`] runs it (a second ago's
//! cache makes that take about a second).
//!
//! ```no_run
//! use msgr_testsuite::guest::{GuestCommand, GuestRunner};
//! use std::time::Duration;
//! let runner = GuestRunner::from_env().expect("guest");
//! let out = runner
//!     .run(&[GuestCommand::shell("devices", "ibv_devices")], Duration::from_secs(120))
//!     .expect("guest run");
//! out.assert_success();
//! ```
//!
//! A test that needs the guest and cannot get it must fail, with the reason
//! ([`GuestError`] says which); it never passes silently.
//!
//! # Layers
//!
//! 1. `reference`, `stress`, `tool`, `twohosts`: guest runs of the reference
//!    RDMA programs, of the stress suite and of the msgr tool, and the wire
//!    between two RDMA hosts in one guest, each built on this module's
//!    runner alone.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod reference;
pub mod stress;
pub mod tool;
pub mod twohosts;

/// The guest's second stage, copied into every job directory.
const STAGE2: &str = include_str!("../guest/stage2.sh");

/// Environment variable naming the cache directory of setup.sh.
pub const CACHE_ENV: &str = "MSGR_GUEST_CACHE";
/// Default cache directory (outside the repository, so fresh clones start warm).
pub const DEFAULT_CACHE: &str = "/var/cache/msgr-guest";
/// Set to 1 in the environment of every command run inside the guest.
pub const IN_GUEST_ENV: &str = "MSGR_IN_GUEST";
/// A file that exists only inside the guest (the host's /run is not visible there).
pub const IN_GUEST_MARKER: &str = "/run/msgr-guest";
/// Soft-RoCE device on dummy netdev d0 (rdma_cm over RoCE).
pub const RXE_CM_ADDR: &str = "198.51.100.1";
/// Soft-iWARP device on dummy netdev d1 (rdma_cm over iWARP).
pub const SIW_CM_ADDR: &str = "198.51.100.2";

/// Builds host programs for the guest with the calling test binary's profile
/// and target directory (so the guest runs exactly that build) and returns
/// the profile's directory (binaries land there, examples in its `examples`).
/// `selection` is cargo's package, feature and target selection, e.g.
/// `["-p", "msgr-tool", "--features", "verbs", "--bin", "msgr"]`. Panics
/// with cargo's status if the build fails: a test cannot go on without it.
pub fn build_programs(selection: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/<profile>/deps/<test>-<hash>
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let profile = profile_dir
        .file_name()
        .expect("profile name")
        .to_string_lossy()
        .into_owned();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .args(selection)
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let status = cmd.status().expect("run cargo build");
    assert!(
        status.success(),
        "cargo build {selection:?} failed: {status}"
    );
    profile_dir.to_path_buf()
}

/// Builds one integration-test binary (`cargo test --no-run`) for the guest
/// with the calling test binary's profile and target directory, and returns
/// its path (test binaries carry a hash in their name, so the path comes from
/// cargo's JSON messages). `selection` is e.g. `["-p", "msgr", "--features",
/// "fabric", "--test", "fabric"]`; `test` is the test target's name.
pub fn build_test_binary(selection: &[&str], test: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    // The dev profile builds into `debug`.
    let profile = match profile_dir.file_name().expect("profile name").to_str() {
        Some("debug") => "dev".to_string(),
        other => other.expect("profile name is UTF-8").to_string(),
    };
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .args(selection)
    .arg("--manifest-path")
    .arg(&manifest)
    .arg("--target-dir")
    .arg(target_dir)
    .args(["--profile", profile.as_str()])
    .stderr(Stdio::inherit());
    let out = cmd.output().expect("run cargo test --no-run");
    assert!(
        out.status.success(),
        "cargo test --no-run {selection:?} failed: {}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == test)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo built no test binary `{test}` for {selection:?}"))
}

/// [`build_programs`] for examples: returns the profile's `examples`
/// directory. `selection` is e.g. `["-p", "msgr-rdma", "--examples"]`.
pub fn build_examples(selection: &[&str]) -> PathBuf {
    build_programs(selection).join("examples")
}

/// True when running inside the msgr test guest (both markers present).
/// Tests that use the TEST-NET-2 addresses must check this first: on the host
/// those addresses would route off the machine.
pub fn in_guest() -> bool {
    std::env::var(IN_GUEST_ENV).as_deref() == Ok("1") && Path::new(IN_GUEST_MARKER).exists()
}

/// Which kernel modules the guest loads besides the RDMA set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuestVariant {
    /// RDMA devices only (rxe0, rxe1, siw0).
    #[default]
    Rdma,
    /// Also veth and sch_netem, for TCP between network namespaces with
    /// `tc qdisc ... netem` loss, delay, duplication and reordering.
    Netem,
}

/// One command to run in the guest: a `sh` script, run as root in the host's
/// (read-only) root filesystem, in `TMPDIR=/run/tmp` (a tmpfs; the host's
/// `/tmp` stays visible, read-only, so binaries built there run).
#[derive(Clone, Debug)]
pub struct GuestCommand {
    /// Label for reports.
    pub name: String,
    /// Shell script text (run by /bin/sh).
    pub script: String,
    /// Killed after this long (the outcome then says `timed_out`).
    pub timeout: Duration,
}

impl GuestCommand {
    /// A shell command with the default per-command timeout (60 s).
    pub fn shell(name: impl Into<String>, script: impl Into<String>) -> Self {
        GuestCommand {
            name: name.into(),
            script: script.into(),
            timeout: Duration::from_secs(60),
        }
    }

    /// A program with arguments, each quoted for the shell.
    pub fn program<S: AsRef<str>>(name: impl Into<String>, program: &Path, args: &[S]) -> Self {
        let mut script = shell_quote(&program.to_string_lossy());
        for a in args {
            script.push(' ');
            script.push_str(&shell_quote(a.as_ref()));
        }
        Self::shell(name, script)
    }

    /// Replaces the per-command timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Quotes `s` for /bin/sh.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What one command did.
#[derive(Clone, Debug)]
pub struct CommandOutcome {
    /// The command's name ([`GuestCommand::name`]).
    pub name: String,
    /// Exit status; `None` when the command never ran or never finished
    /// (guest died, overall deadline hit).
    pub exit_status: Option<i32>,
    /// The per-command timeout killed it.
    pub timed_out: bool,
    /// stdout and stderr, interleaved.
    pub output: String,
}

impl CommandOutcome {
    /// The command ran and exited 0.
    pub fn success(&self) -> bool {
        self.exit_status == Some(0)
    }
}

/// The result of one guest boot.
#[derive(Clone, Debug)]
pub struct GuestOutcome {
    /// One entry per command, in order.
    pub commands: Vec<CommandOutcome>,
    /// The guest's serial console (kernel messages, init's progress).
    pub console: String,
    /// Output of the guest's device set-up (rdma link add ...).
    pub setup_log: String,
    /// The overall deadline killed qemu.
    pub deadline_hit: bool,
    /// The guest kernel locked up (its console's line saying so) and qemu
    /// was killed then, not at the deadline ([`GuestRunner::run`]).
    pub kernel_lockup: Option<String>,
    /// Boots of this job before this one whose kernel locked up (their
    /// console lines): the job ran again from the start.
    pub lockups_before: Vec<String>,
    /// Wall time from qemu start to its exit.
    pub elapsed: Duration,
}

impl GuestOutcome {
    /// Every command ran and exited 0.
    pub fn all_succeeded(&self) -> bool {
        !self.deadline_hit
            && self.kernel_lockup.is_none()
            && self.commands.iter().all(CommandOutcome::success)
    }

    /// The outcome of the command called `name`.
    pub fn command(&self, name: &str) -> Option<&CommandOutcome> {
        self.commands.iter().find(|c| c.name == name)
    }

    /// Panics with the full report unless every command succeeded.
    #[track_caller]
    pub fn assert_success(&self) {
        assert!(self.all_succeeded(), "guest run failed:\n{self}");
    }
}

impl fmt::Display for GuestOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "guest run: {:.1} s{}",
            self.elapsed.as_secs_f64(),
            if self.deadline_hit {
                " -- OVERALL DEADLINE HIT, qemu killed"
            } else {
                ""
            }
        )?;
        if let Some(line) = &self.kernel_lockup {
            writeln!(f, "--- GUEST KERNEL LOCKED UP, qemu killed: {line}")?;
        }
        for line in &self.lockups_before {
            writeln!(
                f,
                "--- an earlier boot of this job was killed when its kernel locked up ({line}); \
                 the job ran again from the start in this one"
            )?;
        }
        for c in &self.commands {
            let status = match (c.exit_status, c.timed_out) {
                (_, true) => "TIMED OUT".to_string(),
                (Some(s), _) => format!("exit {s}"),
                (None, _) => "did not run".to_string(),
            };
            writeln!(f, "--- [{}] {status}", c.name)?;
            for line in c.output.lines() {
                writeln!(f, "    {line}")?;
            }
        }
        if !self.all_succeeded() {
            writeln!(f, "--- guest setup log:\n{}", self.setup_log)?;
            let tail: Vec<&str> = self.console.lines().rev().take(40).collect();
            writeln!(f, "--- guest console (last {} lines):", tail.len())?;
            for line in tail.iter().rev() {
                writeln!(f, "    {line}")?;
            }
        }
        Ok(())
    }
}

/// Why a guest command's figures are missing: the command did not run or
/// failed, or its output did not hold them. Each message starts with the
/// command or tool it is about.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FiguresError {
    /// The command was not in the guest run.
    #[error("{0}: not run")]
    NotRun(String),
    /// The command failed: its exit status and first lines of output.
    #[error("{name}: exit {status:?}{}: {head}", if *timed_out { " (timed out)" } else { "" })]
    Failed {
        /// The command.
        name: String,
        /// Its exit status, if it exited.
        status: Option<i32>,
        /// Whether it was stopped at its timeout.
        timed_out: bool,
        /// Its first lines, joined by ` | `.
        head: String,
    },
    /// A perftest tool printed no row of figures.
    #[error("{0}: no result row")]
    NoRow(&'static str),
    /// The rping wrapper printed no timing line.
    #[error("rping: no timing line")]
    NoTimingLine,
    /// A field of the rping timing line is not a number.
    #[error("rping: bad {0}")]
    BadRpingField(&'static str),
    /// The rping timing line has another shape.
    #[error("rping: cannot parse {0:?}")]
    RpingLine(String),
    /// No `result LABEL {json}` line.
    #[error("{0}: no result line")]
    NoResultLine(String),
    /// The result line's JSON did not parse.
    #[error("{label}: bad JSON ({reason}): {line}")]
    BadJson {
        /// The result's label.
        label: String,
        /// What serde_json said.
        reason: String,
        /// The JSON text.
        line: String,
    },
    /// A figure is not in the result.
    #[error("{label}: no {path}")]
    Missing {
        /// The result's label.
        label: String,
        /// The figure's path, dotted.
        path: String,
    },
    /// A figure is not a number.
    #[error("{label}: {path} is not a number")]
    NotNumber {
        /// The result's label.
        label: String,
        /// The figure's path, dotted.
        path: String,
    },
    /// A figure is infinite or NaN.
    #[error("{label}: {path} is not finite")]
    NotFinite {
        /// The result's label.
        label: String,
        /// The figure's path, dotted.
        path: String,
    },
    /// The figures parsed but say the run did nothing.
    #[error("{label}: no operation done: {figures}")]
    NoOperation {
        /// The result's label.
        label: String,
        /// The figures, debug-printed.
        figures: String,
    },
    /// The figures parsed but count nothing or are for another size.
    #[error("{label}: {figures}")]
    Implausible {
        /// The result's label.
        label: String,
        /// The figures, debug-printed.
        figures: String,
    },
}

/// Why the guest could not be used. Tests that need RDMA fail with this.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The setup script (`testsuite/guest/setup.sh`) could not run or failed.
    #[error("guest setup ({script}) failed: {reason}")]
    Setup {
        /// The setup script.
        script: PathBuf,
        /// Why it could not run, or its exit status and output.
        reason: String,
    },
    /// The cache lacks a piece the guest needs (its env file, qemu, kernel
    /// or initramfs).
    #[error("guest cache {path} is incomplete ({reason}); run testsuite/guest/setup.sh")]
    Cache {
        /// The cache's env file (`current.env`).
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// qemu could not be started.
    #[error("cannot start qemu ({qemu}): {source}")]
    Spawn {
        /// The qemu binary.
        qemu: PathBuf,
        /// The error starting it.
        #[source]
        source: io::Error,
    },
    /// A file of the run (the job directory, the machine lock) could not be
    /// created, written or read.
    #[error("guest job directory {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The guest never started running commands: device set-up failed, the
    /// guest exited early, the deadline passed, or another guest held the
    /// machine lock.
    #[error("the guest did not reach its command loop ({reason})\n{console_tail}")]
    Boot {
        /// What went wrong.
        reason: String,
        /// The last lines of the guest's serial console.
        console_tail: String,
    },
    /// The guest kernel locked up before it started running commands; qemu
    /// was killed.
    #[error("the guest kernel locked up before its command loop ({line})\n{console_tail}")]
    KernelLockup {
        /// The console line that reported the lockup.
        line: String,
        /// The last lines of the guest's serial console.
        console_tail: String,
    },
}

/// Boots the test guest and runs commands in it. One guest at a time per
/// machine (runs are serialised, across processes too, by a lock file in the
/// cache directory): the machines have two cores.
#[derive(Clone, Debug)]
pub struct GuestRunner {
    qemu: PathBuf,
    kernel: PathBuf,
    initrd: PathBuf,
    memory_mib: u32,
    cpus: u32,
    variant: GuestVariant,
    cache: PathBuf,
}

static RUN_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A boot whose init has not said "started" on the console by then is
/// killed and tried again (a TCG boot takes about 10 s; minutes under load).
const BOOT_WATCHDOG: Duration = Duration::from_secs(150);
/// Boots tried again after the watchdog fired, per run.
const BOOT_RETRIES: u32 = 1;

/// How often a running guest's console is read for a kernel lockup.
const LOCKUP_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The first line of the guest's console that says its kernel locked up: a
/// CPU stuck in the kernel for over 20 s (the soft-lockup watchdog). Nothing
/// in user space comes back from that, so waiting for the deadline is
/// minutes for nothing. Seen once (2026-12-04, 1 run in ~11): both vCPUs
/// stuck after rdma_cm destroyed a siw listener whose socket siw had
/// released (Linux 6.1's siw puts that endpoint twice:
/// `msgr_backends` rdma `listen.rs`, which `verbs_messenger` exercises).
fn kernel_lockup(console: &str) -> Option<String> {
    console
        .lines()
        .find(|l| l.contains("BUG: soft lockup") || l.contains("hard LOCKUP"))
        .map(|l| l.trim().to_string())
}

/// Whether the guest's init has written to the serial console yet.
fn console_shows_init(console: &Path) -> bool {
    fs::read_to_string(console).is_ok_and(|c| c.contains("[guest-init]"))
}
static JOB_SEQ: AtomicU64 = AtomicU64::new(0);

impl GuestRunner {
    /// Makes sure the guest cache is complete (runs `testsuite/guest/setup.sh`,
    /// which installs packages and builds the kernel pieces when missing and
    /// takes about a second when warm), then reads it.
    /// `MSGR_GUEST_CACHE` overrides the cache directory.
    pub fn from_env() -> Result<Self, GuestError> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/setup.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| GuestError::Setup {
                script: script.clone(),
                reason: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(GuestError::Setup {
                script,
                reason: format!(
                    "{}\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Self::from_cache(&cache_dir())
    }

    /// Reads a cache that setup.sh already prepared, without running it.
    pub fn from_cache(cache: &Path) -> Result<Self, GuestError> {
        let env_file = cache.join("current.env");
        let text = fs::read_to_string(&env_file).map_err(|e| GuestError::Cache {
            path: env_file.clone(),
            reason: e.to_string(),
        })?;
        let vars: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let get = |k: &str| -> Result<PathBuf, GuestError> {
            let p = PathBuf::from(vars.get(k).ok_or_else(|| GuestError::Cache {
                path: env_file.clone(),
                reason: format!("no {k}"),
            })?);
            if p.exists() {
                Ok(p)
            } else {
                Err(GuestError::Cache {
                    path: env_file.clone(),
                    reason: format!("{k}={} does not exist", p.display()),
                })
            }
        };
        Ok(GuestRunner {
            qemu: get("MSGR_GUEST_QEMU")?,
            kernel: get("MSGR_GUEST_KERNEL")?,
            initrd: get("MSGR_GUEST_INITRD")?,
            memory_mib: 1024,
            cpus: 2,
            variant: GuestVariant::Rdma,
            cache: cache.to_path_buf(),
        })
    }

    /// Selects the module set (e.g. [`GuestVariant::Netem`]).
    pub fn variant(mut self, variant: GuestVariant) -> Self {
        self.variant = variant;
        self
    }

    /// Boots the guest, runs `commands` one after another (each under its own
    /// timeout), powers off, and returns every command's exit status and output.
    /// qemu is killed when `deadline` (for the whole boot) passes; the outcome
    /// then says `deadline_hit` and the unfinished commands have no status.
    /// Errors only when the guest could not be started or never reached the
    /// command loop; a failing command is an `Ok` outcome that says so.
    ///
    /// A guest whose kernel locks up (a soft-lockup report on its console)
    /// is killed at once and the whole job runs again in a fresh boot, once,
    /// saying so on stderr and in the outcome (`lockups_before`); a second
    /// lockup is the outcome (`kernel_lockup`), which no test passes.
    pub fn run(
        &self,
        commands: &[GuestCommand],
        deadline: Duration,
    ) -> Result<GuestOutcome, GuestError> {
        let first = self.run_once(commands, deadline);
        let line = match &first {
            Ok(out) => out.kernel_lockup.clone(),
            Err(GuestError::KernelLockup { line, .. }) => Some(line.clone()),
            Err(_) => None,
        };
        let Some(line) = line else {
            return first;
        };
        match &first {
            Ok(out) => eprintln!("{out}"),
            Err(e) => eprintln!("{e}"),
        }
        eprintln!(
            "guest: THE GUEST KERNEL LOCKED UP ({line}); qemu was killed. Running the whole \
             job again in a fresh boot, once."
        );
        let mut again = self.run_once(commands, deadline)?;
        again.lockups_before.push(line);
        Ok(again)
    }

    /// One boot of [`GuestRunner::run`].
    fn run_once(
        &self,
        commands: &[GuestCommand],
        deadline: Duration,
    ) -> Result<GuestOutcome, GuestError> {
        let _one_guest = RUN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // And one guest per machine: other processes (another clone's test
        // run) take the same lock in the cache directory.
        let _machine_lock = MachineLock::acquire(&self.cache.join(".guest-run.lock"), deadline)?;
        let job = JobDir::create()?;
        job.write("stage2.sh", STAGE2)?;
        let mut index = String::new();
        for (i, c) in commands.iter().enumerate() {
            let name: String = c
                .name
                .chars()
                .map(|ch| if ch.is_whitespace() { '_' } else { ch })
                .collect();
            index.push_str(&format!("{i} {} {name}\n", c.timeout.as_secs().max(1)));
            job.write(&format!("cmd.{i}"), &c.script)?;
        }
        job.write("cmds", &index)?;

        let console_path = job.path.join("console.log");
        let start = Instant::now();
        let mut deadline_hit = false;
        let mut lockup = None;
        let mut failed_boots = 0;
        'boot: loop {
            let attempt = Instant::now();
            let mut child = self.spawn(&job.path, &console_path)?;
            let mut started = false;
            let mut next_lockup_check = Instant::now() + LOCKUP_CHECK_EVERY;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break 'boot,
                    Ok(None) if start.elapsed() >= deadline => {
                        deadline_hit = true;
                        let _ = child.kill();
                        let _ = child.wait();
                        break 'boot;
                    }
                    Ok(None) => {
                        if Instant::now() >= next_lockup_check {
                            next_lockup_check = Instant::now() + LOCKUP_CHECK_EVERY;
                            let console = fs::read_to_string(&console_path).unwrap_or_default();
                            if let Some(line) = kernel_lockup(&console) {
                                lockup = Some(line);
                                let _ = child.kill();
                                let _ = child.wait();
                                break 'boot;
                            }
                        }
                        if !started && attempt.elapsed() >= BOOT_WATCHDOG {
                            started = console_shows_init(&console_path);
                            if !started && failed_boots < BOOT_RETRIES {
                                // Seen once on a heavily loaded host: qemu ran
                                // for minutes with an empty console. Nothing
                                // of the job has run yet, so boot again.
                                failed_boots += 1;
                                eprintln!(
                                    "guest: no init after {BOOT_WATCHDOG:?}; killing qemu and booting again"
                                );
                                let _ = child.kill();
                                let _ = child.wait();
                                continue 'boot;
                            }
                            started = true; // out of retries: the deadline decides
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(GuestError::Io {
                            path: job.path.clone(),
                            source: e,
                        });
                    }
                }
            }
        }
        let elapsed = start.elapsed();
        let console = fs::read_to_string(&console_path).unwrap_or_default();
        let setup_log = job.read("setup.log");
        let status = job.read("status");
        let status = status.trim();
        if status.is_empty() || status == "setup-failed" {
            let tail: Vec<&str> = console.lines().rev().take(40).collect();
            let console_tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
            if let Some(line) = lockup {
                return Err(GuestError::KernelLockup { line, console_tail });
            }
            let reason = if deadline_hit {
                format!("overall deadline of {deadline:?} hit")
            } else if status == "setup-failed" {
                format!("device set-up failed:\n{setup_log}")
            } else {
                let init_err = job.read("init-error");
                if init_err.is_empty() {
                    "guest exited early".to_string()
                } else {
                    init_err
                }
            };
            return Err(GuestError::Boot {
                reason,
                console_tail,
            });
        }
        let commands = commands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let exit_status = job.read(&format!("rc.{i}")).trim().parse::<i32>().ok();
                CommandOutcome {
                    name: c.name.clone(),
                    exit_status,
                    // timeout(1) exits 124 when it had to stop the command (137 after -k).
                    timed_out: matches!(exit_status, Some(124) | Some(137)),
                    output: job.read(&format!("out.{i}")),
                }
            })
            .collect();
        Ok(GuestOutcome {
            commands,
            console,
            setup_log,
            deadline_hit,
            kernel_lockup: lockup,
            lockups_before: Vec::new(),
            elapsed,
        })
    }

    fn spawn(&self, job: &Path, console: &Path) -> Result<Child, GuestError> {
        let variant = match self.variant {
            GuestVariant::Rdma => "rdma",
            GuestVariant::Netem => "netem",
        };
        Command::new(&self.qemu)
            .args(["-accel", "tcg", "-nic", "none", "-no-reboot"])
            .args(["-display", "none", "-monitor", "none"])
            .args(["-m", &self.memory_mib.to_string()])
            .args(["-smp", &self.cpus.to_string()])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&self.initrd)
            .arg("-append")
            .arg(format!(
                "console=ttyS0 quiet panic=-1 tsc=reliable clocksource=tsc msgr.variant={variant}"
            ))
            .arg("-virtfs")
            .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=job,security_model=none",
                job.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| GuestError::Spawn {
                qemu: self.qemu.clone(),
                source,
            })
    }
}

/// An exclusive flock(1) on a file, held by a helper process for as long as
/// this value lives (and released by the kernel if this process dies: the
/// helper's stdin closes, it exits, the lock goes with it).
struct MachineLock {
    child: Child,
}

impl MachineLock {
    fn acquire(path: &Path, timeout: Duration) -> Result<Self, GuestError> {
        use std::io::{BufRead, BufReader};
        let io_err = |source| GuestError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut child = Command::new("flock")
            .arg("-x")
            .arg("-w")
            .arg(timeout.as_secs().max(1).to_string())
            .arg(path)
            .args(["-c", "echo locked; exec cat >/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io_err)?;
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(io_err)?;
        if line.trim() != "locked" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(GuestError::Boot {
                reason: format!(
                    "another guest held {} for the whole deadline of {timeout:?}",
                    path.display()
                ),
                console_tail: String::new(),
            });
        }
        Ok(MachineLock { child })
    }
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        drop(self.child.stdin.take()); // cat sees EOF, flock exits, lock released
        let _ = self.child.wait();
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
}

/// A job directory shared writable with the guest; removed on drop.
struct JobDir {
    path: PathBuf,
}

impl JobDir {
    fn create() -> Result<Self, GuestError> {
        let path = std::env::temp_dir().join(format!(
            "msgr-guest-job-{}-{}",
            std::process::id(),
            JOB_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).map_err(|source| GuestError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(JobDir { path })
    }

    fn write(&self, name: &str, text: &str) -> Result<(), GuestError> {
        let p = self.path.join(name);
        fs::write(&p, text).map_err(|source| GuestError::Io { path: p, source })
    }

    fn read(&self, name: &str) -> String {
        fs::read(self.path.join(name))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/usr/bin/ib_send_lat"), "/usr/bin/ib_send_lat");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn a_kernel_lockup_is_read_off_the_console() {
        let quiet = "[    1.2] siw: iWARP device siw0 added\n[guest-init] started\n";
        assert_eq!(kernel_lockup(quiet), None);
        // An RCU stall warning alone is not a lockup: a loaded TCG guest
        // can print one and recover.
        let stall = "[ 580.38] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n";
        assert_eq!(kernel_lockup(stall), None);
        let locked = format!(
            "{quiet}{stall}[  544.827532] watchdog: BUG: soft lockup - CPU#1 stuck for 455s! \
             [msgr-worker-0:205]\n[  572.8] watchdog: BUG: soft lockup - CPU#1 stuck for 481s!\n"
        );
        assert_eq!(
            kernel_lockup(&locked).as_deref(),
            Some("[  544.827532] watchdog: BUG: soft lockup - CPU#1 stuck for 455s! [msgr-worker-0:205]")
        );
    }

    #[test]
    fn not_in_guest_on_host() {
        // The host's /run never has the marker (only the guest's tmpfs /run does).
        if !Path::new(IN_GUEST_MARKER).exists() {
            assert!(!in_guest());
        }
    }
}
