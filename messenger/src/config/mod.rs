//! Messenger configuration: defaults, a TOML file, environment variables.
//!
//! Every key can be set the same three ways, through one setter
//! ([`MessengerConfig::set`]): in code, in a TOML file with flat `key = value`
//! lines ([`MessengerConfig::from_file`]), or as `MSGR_<KEY>` environment
//! variables ([`MessengerConfig::apply_env`]). The keys are the rows of
//! one table, [`CONFIG_KEYS`], which docs/CONFIG.md shows.

use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use msgr_proto::auth::{Credentials, Keyring, Security, StaticKeypair};
use msgr_proto::{FrameLimits, Policy, SessionConfig};

mod keys;

pub use keys::CONFIG_KEYS;
use keys::{config_key, did_you_mean};
use thiserror::Error;

/// A configuration key or value was not understood.
///
/// ```
/// let err = msgr::MessengerConfig::default().set("wokrers", "2").unwrap_err();
/// assert!(matches!(err, msgr::ConfigError::UnknownKey(_)));
/// ```
#[derive(Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No such key.
    #[error("unknown configuration key `{0}`{hint}", hint = did_you_mean(.0, |k| format!("`{k}`")))]
    UnknownKey(String),
    /// An `MSGR_` environment variable that names no key (and is not
    /// `MSGR_CONFIG` or reserved, [`RESERVED_ENV`]).
    #[error("unknown environment variable {0}{hint}", hint = did_you_mean(.0.strip_prefix("MSGR_").unwrap_or(.0), |k| format!("MSGR_{}", k.to_ascii_uppercase())))]
    UnknownEnv(String),
    /// The value does not parse for that key.
    #[error("bad value `{}` for `{key}`: {why}", msgr_addr::excerpt(value))]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What was expected.
        why: String,
    },
    /// The file could not be read or parsed.
    #[error("configuration file {path}: {why}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        why: String,
    },
}

msgr_addr::debug_is_display!(ConfigError);

/// Prefixes of `MSGR_` environment variables that are not configuration
/// keys but belong to msgr's test harness (the guest, the stress suite);
/// [`MessengerConfig::apply_env`] passes over them. Any other unknown
/// `MSGR_` variable is an error.
pub const RESERVED_ENV: &[&str] = &["MSGR_IN_GUEST", "MSGR_GUEST_", "MSGR_STRESS_", "MSGR_TEST_"];

/// Configuration of a [`crate::Messenger`].
///
/// ```
/// use msgr::MessengerConfig;
/// let mut cfg = MessengerConfig::default();
/// cfg.set("workers", "2").unwrap();
/// cfg.set("policy", "lossy-client").unwrap();
/// assert_eq!(cfg.workers, 2);
/// assert!(cfg.set("no_such_key", "1").is_err());
/// ```
#[derive(Clone, Debug)]
pub struct MessengerConfig {
    /// Worker threads, each with its own event loop.
    pub workers: usize,
    /// How long a worker keeps polling without blocking after activity
    /// (0: never); regular traffic widens it up to `busy_poll_max`.
    pub busy_poll: Duration,
    /// How long a blocking call spins on its reply before it parks its
    /// thread (0: at once): only while the connection's worker is awake
    /// and the process's CPUs leave one spare beside the caller, its
    /// workers and its other spinning callers (never on 2 CPUs).
    pub call_spin: Duration,
    /// An RMA read or write longer than this moves in parts of at most
    /// this many bytes (and of what one message may carry), each its own
    /// request.
    pub rma_part_bytes: usize,
    /// Parts of one RMA operation in flight at once.
    pub rma_parts_in_flight: usize,
    /// The widest the busy-poll window grows: an idle gap no longer than
    /// this that ended in activity makes the next window twice the gap (at
    /// least `busy_poll`), so traffic with regular gaps a little past
    /// `busy_poll` (a 1 MiB ping-pong) is not put to sleep between every
    /// message; a longer gap takes the window back to `busy_poll`. Equal to
    /// `busy_poll` or below: a fixed window.
    pub busy_poll_max: Duration,
    /// While busy-polling, a worker calls `epoll_wait` (unless a transport
    /// needs it every pass: TCP) and, when idle, `sched_yield` on one pass
    /// in this many. Default 0: adaptive — epoll on one pass in 16 where no
    /// transport needs it every pass, and a yield on every idle pass while
    /// yields give the core to another thread (a soft RDMA device's kernel
    /// threads, say), backing off to one in 64 while they find no one to
    /// run; and either call no sooner than 64 times its quickest run seen
    /// after the last (at most 50 µs), so that where system calls are dear
    /// they take no more than ~1/64 of a spinning worker's time. 1 is every
    /// pass, for both.
    pub busy_poll_syscall_every: u32,
    /// CPUs the workers are pinned to: worker `i` runs on
    /// `worker_cpus[i % len]`. Empty (the default): the scheduler places
    /// them. A busy-polling worker that shares its CPU with another busy
    /// thread gets half of it until the scheduler moves one of them
    /// (module `affinity` says what was measured); pin where
    /// latency matters and a CPU can be spared per worker. A pinned
    /// busy-polling worker whose CPU another busy thread also wants cannot
    /// move away, and spinning there waits out that thread's time slices
    /// (a 64 B round trip measured ~2 ms against 15–60 µs placed by the
    /// scheduler, with a build on both cores; docs/BENCHMARKS.md,
    /// 2026-12-04): when a yield hands such a thread a whole slice, the
    /// worker sleeps on its wait fds instead of spinning for a while
    /// (counter `spin_pauses`; the worker's `spin` module).
    ///
    /// ```
    /// let mut cfg = msgr::MessengerConfig::default();
    /// cfg.set("worker_cpus", "0").unwrap();
    /// assert_eq!(cfg.worker_cpus, vec![0]);
    /// // A CPU this process may not run on is refused at once.
    /// assert!(cfg.set("worker_cpus", "100000").is_err());
    /// ```
    pub worker_cpus: Vec<usize>,
    /// Policy of connections opened with [`crate::Messenger::connect`].
    pub policy: Policy,
    /// Session tunables (timers, queue bounds, frame limits).
    pub session: SessionConfig,
    /// Received messages the application may hold before reading pauses
    /// (at most 4 Mi: larger values count as that).
    pub rx_throttle_messages: usize,
    /// Received payload bytes the application may hold before reading pauses
    /// (at most 512 GiB: larger values count as that).
    pub rx_throttle_bytes: usize,
    /// Accepted links that may be mid-handshake at once, per worker (bounds
    /// what unauthenticated peers can make us hold): a new one beyond it
    /// closes the oldest idle one, of any source, or waits for a slot
    /// (up to 16 times as many wait, unread, per worker).
    pub max_handshakes: usize,
    /// Registered memory of the RDMA backends, per worker, and their
    /// rendezvous read deadline.
    pub rdma: msgr_backends::RdmaPoolConfig,
    /// SO_SNDBUF and SO_RCVBUF of TCP links (0: the kernel's autotuning).
    pub tcp_socket_buffer: usize,
    /// Faults to inject at the transport boundary (tests and fault drills;
    /// cargo feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub faults: Option<crate::faults::FaultPlan>,
    /// What a panic in a [`crate::Dispatcher`] callback does: end that
    /// connection (default) or abort the process.
    pub handler_panic: HandlerPanicPolicy,
    /// The addresses to listen on when the builder is given none
    /// ([`crate::MessengerBuilder::bind`]): each one's transport picks its
    /// backend; the first is the messenger's own address.
    pub bind: Vec<msgr_addr::EntityAddr>,
    /// Most pending handshakes per worker from one IP address (see
    /// `max_handshakes`): a new link from a source at its share makes room
    /// by closing that source's own oldest idle link (one that has not sent
    /// its banner though the worker had the time to read it), so a good
    /// client sharing an address with an idle flood still gets in; while
    /// none of the source's links is idle, the new one waits, unread, for
    /// a slot (a burst from one address), refused only when too many wait.
    pub max_handshakes_per_source: usize,
    /// Peers this messenger talks to ([`crate::Messenger::connect_peers`]):
    /// their addresses' transports pick the backends, so a configuration
    /// file or the environment alone says where and over what to connect.
    pub peers: Vec<msgr_addr::EntityAddr>,
    /// The private key file for the `auth` and `secure` modes (key
    /// `key_file`); read when the messenger starts.
    pub key_file: Option<std::path::PathBuf>,
    /// The keyring file for the `auth` and `secure` modes (key `keyring`);
    /// read when the messenger starts.
    pub keyring: Option<std::path::PathBuf>,
}

impl Default for MessengerConfig {
    fn default() -> Self {
        MessengerConfig {
            workers: 1,
            busy_poll: Duration::from_micros(200),
            call_spin: Duration::from_micros(50),
            rma_part_bytes: 1 << 20,
            rma_parts_in_flight: 8,
            busy_poll_max: Duration::from_micros(2000),
            busy_poll_syscall_every: 0,
            worker_cpus: Vec::new(),
            policy: Policy::LosslessClient,
            session: SessionConfig::default(),
            rx_throttle_messages: 64 * 1024,
            rx_throttle_bytes: 512 << 20,
            max_handshakes: 1024,
            max_handshakes_per_source: 256,
            rdma: msgr_backends::RdmaPoolConfig::default(),
            tcp_socket_buffer: 0,
            #[cfg(feature = "fault-injection")]
            faults: None,
            handler_panic: HandlerPanicPolicy::FailConnection,
            bind: Vec::new(),
            peers: Vec::new(),
            key_file: None,
            keyring: None,
        }
    }
}

impl MessengerConfig {
    /// The session security of a messenger named `name`: the modes
    /// configured, and where they need a handshake, `given` credentials or
    /// those read from `key_file` and `keyring`. The key file must be
    /// `name`'s: a process started with another entity's key is refused
    /// here, not at its first handshake.
    ///
    /// ```
    /// use msgr::{EntityName, MessengerConfig};
    /// let mut cfg = MessengerConfig::default();
    /// assert!(cfg.security_for(&EntityName::client(1), None).is_ok()); // crc mode: no keys
    /// cfg.set("security", "secure")?;
    /// // Secure mode needs this entity's key: none was given, no key_file set.
    /// assert!(cfg.security_for(&EntityName::client(1), None).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn security_for(
        &self,
        name: &msgr_addr::EntityName,
        given: Option<Arc<Credentials>>,
    ) -> Result<Security, ConfigError> {
        let modes = self.session.security.modes;
        if !modes.needs_credentials() {
            return Ok(Security {
                modes,
                credentials: None,
            });
        }
        if let Some(c) = given.or_else(|| self.session.security.credentials.clone()) {
            if c.name != *name {
                return Err(ConfigError::BadValue {
                    key: "key_file".into(),
                    value: c.name.to_string(),
                    why: format!("the credentials are {}'s, the messenger is {name}", c.name),
                });
            }
            return Ok(Security {
                modes,
                credentials: Some(c),
            });
        }
        let need = |key: &str, path: &Option<std::path::PathBuf>| {
            path.clone().ok_or_else(|| ConfigError::BadValue {
                key: key.into(),
                value: String::new(),
                why: format!("security `{modes}` needs key_file and keyring"),
            })
        };
        let (key_path, ring_path) = (
            need("key_file", &self.key_file)?,
            need("keyring", &self.keyring)?,
        );
        let read = |p: &std::path::Path| {
            let meta = std::fs::metadata(p).map_err(|e| file_error(p, e.to_string()))?;
            if meta.len() > MAX_CONFIG_FILE {
                return Err(file_error(p, format!("over {MAX_CONFIG_FILE} bytes")));
            }
            std::fs::read_to_string(p).map_err(|e| file_error(p, e.to_string()))
        };
        let (key_name, keypair) =
            StaticKeypair::parse_key_file(&zeroize::Zeroizing::new(read(&key_path)?))
                .map_err(|e| file_error(&key_path, e.to_string()))?;
        if key_name != *name {
            return Err(file_error(
                &key_path,
                format!("the key is {key_name}'s, the messenger is {name}"),
            ));
        }
        let ring = Keyring::parse(&read(&ring_path)?)
            .map_err(|e| file_error(&ring_path, e.to_string()))?;
        if ring.get(name) != Some(&keypair.public()) {
            return Err(file_error(
                &ring_path,
                format!(
                    "does not list {name} with the key of {}",
                    key_path.display()
                ),
            ));
        }
        Ok(Security {
            modes,
            credentials: Some(Arc::new(Credentials::new(
                name.clone(),
                keypair,
                Arc::new(ring),
            ))),
        })
    }
}

fn file_error(path: &std::path::Path, why: String) -> ConfigError {
    ConfigError::File {
        path: path.display().to_string(),
        why,
    }
}

/// The largest configuration file read (1 MiB).
pub const MAX_CONFIG_FILE: u64 = 1 << 20;

/// Parses a policy name as written in configuration.
///
/// ```
/// use msgr::{parse_policy, Policy};
/// assert_eq!(parse_policy("lossless-peer"), Some(Policy::LosslessPeer));
/// assert_eq!(parse_policy("lossfree"), None);
/// ```
pub fn parse_policy(value: &str) -> Option<Policy> {
    Some(match value {
        "lossy-client" | "lossy" => Policy::LossyClient,
        "lossless-client" | "lossless" => Policy::LosslessClient,
        "lossless-peer" | "peer" => Policy::LosslessPeer,
        _ => return None,
    })
}

/// A TOML syntax error as one line, with a hint where a string value was
/// left unquoted: `bind = tcp://…` reads as a misspelt `true`, and the
/// parser's own word for it ("invalid boolean") misleads.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().to_owned();
    let Some(span) = e.span() else {
        return what;
    };
    let line_no = text[..span.start.min(text.len())].matches('\n').count();
    let Some(line) = text.lines().nth(line_no) else {
        return what;
    };
    let at = format!("line {}: {what}: `{}`", line_no + 1, line.trim());
    let Some((key, value)) = line.split_once('=') else {
        return at;
    };
    let value = value.split_once(" #").map_or(value, |(v, _)| v);
    let (key, value) = (key.trim(), value.trim());
    let structured = value.starts_with(['"', '\'', '[', '{'])
        || value.parse::<i64>().is_ok()
        || value == "true"
        || value == "false";
    if structured || value.is_empty() {
        return at;
    }
    // The parser's own message is about something else (a boolean).
    format!(
        "line {}: `{}`: strings must be quoted: {key} = \"{value}\"",
        line_no + 1,
        line.trim()
    )
}

impl MessengerConfig {
    /// Sets one key from its text form, checked against the values the
    /// key takes ([`CONFIG_KEYS`]); a list is comma-separated.
    ///
    /// ```
    /// use msgr::{ConfigError, MessengerConfig};
    /// let mut cfg = MessengerConfig::default();
    /// cfg.set("workers", "4")?;
    /// assert_eq!(cfg.workers, 4);
    /// assert!(matches!(cfg.set("workers", "many"), Err(ConfigError::BadValue { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let row = config_key(key).ok_or_else(|| ConfigError::UnknownKey(key.into()))?;
        // A key sets its own value and nothing else: limits derived from
        // several keys are computed once, from the final values, when the
        // messenger starts (`frame_limits`). (Recomputing them here made
        // any key, `workers` say, move the frame limit.)
        row.apply(self, value)
    }

    /// The frame limits a messenger started with this configuration
    /// enforces, derived once at start from the final values: the segment
    /// limits as set (`max_front_bytes`, `max_data_bytes`) and a frame
    /// limit that follows them, 4096 bytes (preamble, epilogue and room to
    /// spare) above their sum — so raising `max_data_bytes` raises it, and
    /// no frame whose segments are within their limits is ever refused by
    /// it. A `max_frame` set in `session.limits` is replaced.
    ///
    /// ```
    /// let mut cfg = msgr::MessengerConfig::default();
    /// cfg.set("max_data_bytes", "1048576").unwrap();
    /// let l = cfg.frame_limits();
    /// assert_eq!(l.max_frame, 4096 + l.max_segment.iter().map(|&x| u64::from(x)).sum::<u64>());
    /// ```
    pub fn frame_limits(&self) -> FrameLimits {
        let mut l = self.session.limits;
        l.max_frame = 4096 + l.max_segment.iter().map(|&x| u64::from(x)).sum::<u64>();
        l
    }

    /// Reads a TOML file of flat `key = value` lines on top of the defaults.
    ///
    /// ```
    /// let path = std::env::temp_dir().join(format!("msgr-doc-{}.toml", std::process::id()));
    /// std::fs::write(&path, "workers = 3\npolicy = \"lossy-client\"\n")?;
    /// let cfg = msgr::MessengerConfig::from_file(&path)?;
    /// # std::fs::remove_file(&path)?;
    /// assert_eq!(cfg.workers, 3);
    /// assert_eq!(cfg.policy, msgr::Policy::LossyClient);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let mut cfg = MessengerConfig::default();
        cfg.apply_file(path)?;
        Ok(cfg)
    }

    /// Applies a TOML file of flat `key = value` lines.
    ///
    /// ```
    /// let path = std::env::temp_dir().join(format!("msgr-doc-apply-{}.toml", std::process::id()));
    /// std::fs::write(&path, "workers = 3\n")?;
    /// let mut cfg = msgr::MessengerConfig::default();
    /// cfg.set("policy", "lossy-client")?;
    /// cfg.apply_file(&path)?; // only the file's keys change
    /// # std::fs::remove_file(&path)?;
    /// assert_eq!((cfg.workers, cfg.policy), (3, msgr::Policy::LossyClient));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let file_err = |why: String| ConfigError::File {
            path: path.display().to_string(),
            why,
        };
        // Read at most a bound: `/dev/zero` or a log file given by mistake
        // must be an error, not all of memory.
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| {
                use std::io::Read;
                f.take(MAX_CONFIG_FILE + 1).read_to_string(&mut text)
            })
            .map_err(|e| file_err(e.to_string()))?;
        if text.len() as u64 > MAX_CONFIG_FILE {
            return Err(file_err(format!(
                "larger than {MAX_CONFIG_FILE} bytes: not a configuration file"
            )));
        }
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| file_err(toml_error(&text, &e)))?;
        for (key, value) in table {
            let row = config_key(&key).ok_or_else(|| ConfigError::UnknownKey(key.clone()))?;
            let scalar = |v: toml::Value| match v {
                toml::Value::String(s) => Ok(s),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Boolean(b) => Ok(b.to_string()),
                other => Err(file_err(format!("`{key}`: unsupported value {other}"))),
            };
            let text = match value {
                // A list key's items, as its text form writes them.
                toml::Value::Array(items) if row.is_list() => items
                    .into_iter()
                    .map(scalar)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
                toml::Value::Array(_) => {
                    return Err(file_err(format!("`{key}` takes one value, not a list")))
                }
                v => scalar(v)?,
            };
            row.apply(self, &text)?;
        }
        Ok(())
    }

    /// Applies `MSGR_<KEY>` environment variables (e.g. `MSGR_WORKERS=2`), and
    /// the file named by `MSGR_CONFIG` first if set.
    ///
    /// ```
    /// // A doctest is a process of its own: setting its environment is safe here.
    /// std::env::set_var("MSGR_WORKERS", "3");
    /// let mut cfg = msgr::MessengerConfig::default();
    /// cfg.apply_env()?;
    /// assert_eq!(cfg.workers, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_env(&mut self) -> Result<(), ConfigError> {
        self.apply_vars(std::env::vars_os())
    }

    /// [`MessengerConfig::apply_env`] over the given variables: `MSGR_CONFIG`
    /// names a file, read first; `MSGR_<KEY>` sets a key. Any other
    /// `MSGR_` variable is an error (a typo such as `MSGR_WOKRERS` would
    /// otherwise be ignored), as an unknown key in a file is, except the
    /// names reserved for msgr's own test harness ([`RESERVED_ENV`]). A
    /// value that is not UTF-8 is an error too.
    fn apply_vars(
        &mut self,
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<(), ConfigError> {
        let mut keys = Vec::new();
        for (name, value) in vars {
            let Some(name) = name.to_str() else {
                continue;
            };
            let Some(rest) = name.strip_prefix("MSGR_") else {
                continue;
            };
            if RESERVED_ENV.iter().any(|r| name.starts_with(r)) {
                continue;
            }
            let value = value.into_string().map_err(|v| ConfigError::BadValue {
                key: name.into(),
                value: v.to_string_lossy().into_owned(),
                why: "not UTF-8".into(),
            })?;
            let key = rest.to_ascii_lowercase();
            if key == "config" {
                self.apply_file(Path::new(&value))?;
            } else if config_key(&key).is_some() {
                keys.push((key, value));
            } else {
                return Err(ConfigError::UnknownEnv(name.into()));
            }
        }
        // The file first, then the variables, whatever order they came in.
        for (key, value) in keys {
            self.set(&key, &value)?;
        }
        Ok(())
    }

    /// Defaults, then `MSGR_CONFIG`'s file, then `MSGR_*` variables.
    ///
    /// ```
    /// // A doctest is a process of its own: setting its environment is safe here.
    /// std::env::set_var("MSGR_POLICY", "lossy-client");
    /// let cfg = msgr::MessengerConfig::from_env()?;
    /// assert_eq!(cfg.policy, msgr::Policy::LossyClient);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut cfg = MessengerConfig::default();
        cfg.apply_env()?;
        Ok(cfg)
    }
}

/// What a messenger does when a [`Dispatcher`](crate::Dispatcher) callback panics (config key
/// `on_handler_panic`). Either way the panic is logged with the connection
/// and what was being delivered, and counted (`handler_panics`).
///
/// ```
/// use msgr::{HandlerPanicPolicy, MessengerConfig};
/// let mut cfg = MessengerConfig::default();
/// assert_eq!(cfg.handler_panic, HandlerPanicPolicy::FailConnection);
/// cfg.set("on_handler_panic", "abort")?;
/// assert_eq!(cfg.handler_panic, HandlerPanicPolicy::Abort);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HandlerPanicPolicy {
    /// End that connection ([`FaultReason::HandlerPanicked`](crate::FaultReason::HandlerPanicked)
    /// reaches `on_reset`); the worker goes on serving the others.
    #[default]
    FailConnection,
    /// Abort the process, for deployments that prefer a crash and a restart
    /// to running on after a bug.
    Abort,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 60: `fn main() -> Result<(), Box<dyn Error>>` prints the
    /// error it returns with Debug: msgr's errors read there as their
    /// Display does (it printed `Config(UnknownKey("bnid"))`, without the
    /// hint), and long input is cut.
    #[test]
    fn errors_returned_from_main_print_what_display_says() {
        let returned = |e: Box<dyn std::error::Error>| format!("Error: {e:?}");
        let unknown = MessengerConfig::default().set("bnid", "x").unwrap_err();
        assert_eq!(
            returned(crate::MessengerError::Config(unknown).into()),
            "Error: unknown configuration key `bnid`: did you mean `bind`?"
        );
        let bad = "tcp://".to_owned() + &"1".repeat(100_000);
        let e = MessengerConfig::default().set("bind", &bad).unwrap_err();
        let shown = returned(e.into());
        assert!(shown.contains("… (100006 bytes)"), "{shown}");
        assert!(shown.len() < 400, "{} bytes: {shown:.400}", shown.len());
        let e = "tcp:/x".parse::<msgr_addr::EntityAddr>().unwrap_err();
        assert_eq!(returned(e.clone().into()), format!("Error: {e}"));
        let e = crate::RmaError::Call(crate::CallError::Timeout {
            after: std::time::Duration::from_secs(8),
            last_fault: None,
        });
        assert_eq!(returned(e.into()), "Error: no reply within 8s");
    }

    /// Issue 48 (7): a key sets its own value and nothing else. For every
    /// key: set alone to a valid value other than its default, the
    /// configuration differs from the default, and once that key's own
    /// field is put back it is the default again, in every field and limit
    /// (Debug shows them all). `workers` once moved the frame limit.
    #[test]
    fn setting_one_key_never_moves_another() {
        type Restore = fn(&mut MessengerConfig, &MessengerConfig);
        let table: &[(&str, &str, Restore)] = &[
            ("workers", "3", |c, d| c.workers = d.workers),
            ("payload_crc", "false", |c, d| {
                c.session.payload_crc = d.session.payload_crc
            }),
            ("bind", "tcp://127.0.0.1:6800", |c, d| {
                c.bind.clone_from(&d.bind)
            }),
            ("security", "crc,secure", |c, d| {
                c.session.security.modes = d.session.security.modes
            }),
            ("key_file", "/nonexistent", |c, d| {
                c.key_file.clone_from(&d.key_file)
            }),
            ("keyring", "/nonexistent", |c, d| {
                c.keyring.clone_from(&d.keyring)
            }),
            ("max_handshakes_per_source", "3", |c, d| {
                c.max_handshakes_per_source = d.max_handshakes_per_source
            }),
            ("banner_timeout_ms", "3", |c, d| {
                c.session.banner_timeout = d.session.banner_timeout
            }),
            ("connect_timeout_ms", "3", |c, d| {
                c.session.connect_timeout = d.session.connect_timeout
            }),
            ("peers", "tcp://127.0.0.1:6800", |c, d| {
                c.peers.clone_from(&d.peers)
            }),
            ("on_handler_panic", "abort", |c, d| {
                c.handler_panic = d.handler_panic
            }),
            ("batch_max_bytes", "4096", |c, d| {
                c.session.batch_max_bytes = d.session.batch_max_bytes
            }),
            ("busy_poll_us", "3", |c, d| c.busy_poll = d.busy_poll),
            ("call_spin_us", "7", |c, d| c.call_spin = d.call_spin),
            ("rma_part_bytes", "4096", |c, d| {
                c.rma_part_bytes = d.rma_part_bytes
            }),
            ("rma_parts_in_flight", "3", |c, d| {
                c.rma_parts_in_flight = d.rma_parts_in_flight
            }),
            ("busy_poll_max_us", "3", |c, d| {
                c.busy_poll_max = d.busy_poll_max
            }),
            ("busy_poll_syscall_every", "3", |c, d| {
                c.busy_poll_syscall_every = d.busy_poll_syscall_every
            }),
            ("worker_cpus", "0", |c, d| {
                c.worker_cpus.clone_from(&d.worker_cpus)
            }),
            ("policy", "lossless-peer", |c, d| c.policy = d.policy),
            ("keepalive_interval_ms", "3", |c, d| {
                c.session.keepalive_interval = d.session.keepalive_interval
            }),
            ("keepalive_timeout_ms", "3", |c, d| {
                c.session.keepalive_timeout = d.session.keepalive_timeout
            }),
            ("handshake_timeout_ms", "3", |c, d| {
                c.session.handshake_timeout = d.session.handshake_timeout
            }),
            ("backoff_min_ms", "3", |c, d| {
                c.session.backoff_min = d.session.backoff_min
            }),
            ("backoff_max_ms", "3", |c, d| {
                c.session.backoff_max = d.session.backoff_max
            }),
            ("server_linger_ms", "3", |c, d| {
                c.session.server_linger = d.session.server_linger
            }),
            ("max_queued_messages", "3", |c, d| {
                c.session.max_queued_messages = d.session.max_queued_messages
            }),
            ("max_queued_bytes", "3", |c, d| {
                c.session.max_queued_bytes = d.session.max_queued_bytes
            }),
            ("ack_delay_us", "0", |c, d| {
                c.session.ack_delay = d.session.ack_delay
            }),
            ("max_fragment_bytes", "0", |c, d| {
                c.session.max_fragment = d.session.max_fragment
            }),
            ("tcp_socket_buffer_bytes", "65536", |c, d| {
                c.tcp_socket_buffer = d.tcp_socket_buffer
            }),
            ("max_front_bytes", "3", |c, d| {
                c.session.limits.max_segment[1] = d.session.limits.max_segment[1]
            }),
            ("max_data_bytes", "3", |c, d| {
                c.session.limits.max_segment[2] = d.session.limits.max_segment[2]
            }),
            ("rx_throttle_messages", "3", |c, d| {
                c.rx_throttle_messages = d.rx_throttle_messages
            }),
            ("rx_throttle_bytes", "3", |c, d| {
                c.rx_throttle_bytes = d.rx_throttle_bytes
            }),
            ("max_handshakes", "3", |c, d| {
                c.max_handshakes = d.max_handshakes
            }),
            ("rdma_chunk_size", "8192", |c, d| {
                c.rdma.chunk_size = d.rdma.chunk_size
            }),
            ("rdma_rx_chunks", "3", |c, d| {
                c.rdma.rx_chunks = d.rdma.rx_chunks
            }),
            ("rdma_tx_chunks", "3", |c, d| {
                c.rdma.tx_chunks = d.rdma.tx_chunks
            }),
            ("rdma_rendezvous_bytes", "3", |c, d| {
                c.rdma.rendezvous_threshold = d.rdma.rendezvous_threshold
            }),
            ("rdma_inline_bytes", "3", |c, d| {
                c.rdma.inline_bytes = d.rdma.inline_bytes
            }),
            ("rdma_ack_timeout", "18", |c, d| {
                c.rdma.ack_timeout = d.rdma.ack_timeout
            }),
            ("rdma_retry_count", "3", |c, d| {
                c.rdma.retry_count = d.rdma.retry_count
            }),
            ("rdma_read_timeout_ms", "3", |c, d| {
                c.rdma.read_timeout = d.rdma.read_timeout
            }),
            ("rdma_reg_cache_bytes", "3", |c, d| {
                c.rdma.reg_cache_bytes = d.rdma.reg_cache_bytes
            }),
            ("fabric_rendezvous", "off", |c, d| {
                c.rdma.fabric_rendezvous = d.rdma.fabric_rendezvous
            }),
            ("fabric_cq_wait", "poll", |c, d| {
                c.rdma.fabric_cq_wait = d.rdma.fabric_cq_wait
            }),
            ("fabric_link_bytes", "16777216", |c, d| {
                c.rdma.fabric_link_bytes = d.rdma.fabric_link_bytes
            }),
            #[cfg(feature = "fault-injection")]
            ("faults", "seed=1,fail=100", |c, d| {
                c.faults.clone_from(&d.faults)
            }),
        ];
        // Without fault injection `faults` takes only off, its default.
        let listed: Vec<&str> = CONFIG_KEYS
            .iter()
            .map(|k| k.name)
            .filter(|k| cfg!(feature = "fault-injection") || *k != "faults")
            .collect();
        let tested: Vec<&str> = table.iter().map(|(k, _, _)| *k).collect();
        assert_eq!(tested, listed, "one row per key, in CONFIG_KEYS order");
        let default = MessengerConfig::default();
        let want = format!("{default:#?}");
        for (key, value, restore) in table {
            let mut cfg = MessengerConfig::default();
            cfg.set(key, value).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_ne!(
                format!("{cfg:#?}"),
                want,
                "{key}={value} is not its default"
            );
            restore(&mut cfg, &default);
            assert_eq!(
                format!("{cfg:#?}"),
                want,
                "{key}={value} moved another field"
            );
        }
    }

    /// The frame limit at start follows the segment limits, as it did
    /// when `set` derived it: 4096 bytes above their sum, whatever else
    /// was set and in whatever order.
    #[test]
    fn the_frame_limit_at_start_follows_the_segment_limits() {
        let sum = |c: &MessengerConfig| -> u64 {
            c.session
                .limits
                .max_segment
                .iter()
                .map(|&x| u64::from(x))
                .sum()
        };
        let default = MessengerConfig::default();
        assert_eq!(default.frame_limits().max_frame, 4096 + sum(&default));
        assert_eq!(
            default.frame_limits().max_segment,
            default.session.limits.max_segment
        );
        for (front, data) in [("1024", "1048576"), ("1073741824", "4294967295")] {
            let mut cfg = MessengerConfig::default();
            cfg.set("max_data_bytes", data).unwrap();
            cfg.set("max_front_bytes", front).unwrap();
            cfg.set("workers", "2").unwrap();
            let l = cfg.frame_limits();
            let want =
                4096 + 64 * 1024 * 2 + front.parse::<u64>().unwrap() + data.parse::<u64>().unwrap();
            assert_eq!(l.max_frame, want, "front {front}, data {data}");
            assert_eq!(l.max_segment, cfg.session.limits.max_segment);
        }
    }

    /// Environment variables: keys set, the file first; a typo, an unknown
    /// `MSGR_` name or a value that is not UTF-8 refused; the harness's
    /// reserved names and other programs' variables passed over.
    #[test]
    fn environment_variables_are_checked_like_file_keys() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let vars = |v: &[(&str, &[u8])]| -> Vec<(OsString, OsString)> {
            v.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from_vec(v.to_vec())))
                .collect()
        };
        let mut cfg = MessengerConfig::default();
        cfg.apply_vars(vars(&[
            ("MSGR_WORKERS", b"3"),
            ("MSGR_IN_GUEST", b"1"),
            ("MSGR_STRESS_SEED", b"7"),
            ("PATH", b"/bin"),
        ]))
        .unwrap();
        assert_eq!(cfg.workers, 3);
        // One line: the variable, and the key it is likely a typo of.
        let e = MessengerConfig::default()
            .apply_vars(vars(&[("MSGR_WOKRERS", b"2")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "unknown environment variable MSGR_WOKRERS: did you mean MSGR_WORKERS?"
        );
        let e = MessengerConfig::default()
            .apply_vars(vars(&[("MSGR_KEEPALIVE_TIMEOUT", b"2")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("did you mean MSGR_KEEPALIVE_TIMEOUT_MS?"),
            "{e}"
        );
        // Nothing close: no guess, and where the keys are.
        let e = MessengerConfig::default()
            .apply_vars(vars(&[("MSGR_ZZZ", b"2")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("unknown environment variable MSGR_ZZZ: no such key")
                && !e.contains("did you mean")
                && !e.contains('\n'),
            "{e}"
        );
        let e = MessengerConfig::default()
            .apply_vars(vars(&[("MSGR_WORKERS", b"\xff")]))
            .unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }

    /// A file is read up to a bound: `/dev/zero` is an error, at once.
    #[test]
    fn an_endless_file_is_refused_not_read_to_the_end() {
        let e = MessengerConfig::from_file(Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.to_string().contains("not a configuration file") || e.to_string().contains("UTF-8"),
            "{e}"
        );
    }

    /// The bind address is a key: a file or the environment alone picks
    /// the backend.
    #[test]
    fn bind_is_a_key() {
        let mut cfg = MessengerConfig::default();
        cfg.set("bind", "tcp://127.0.0.1:6800").unwrap();
        let bound: Vec<String> = cfg.bind.iter().map(|a| a.to_string()).collect();
        assert_eq!(bound, ["tcp://127.0.0.1:6800"]);
        cfg.set("bind", "tcp://127.0.0.1:6800,tcp://[::1]:6801")
            .unwrap();
        assert_eq!(cfg.bind.len(), 2);
        assert!(cfg.set("bind", "nonsense://x").is_err());
        cfg.set("bind", "none").unwrap();
        assert!(cfg.bind.is_empty());
    }

    /// Peers are a list of addresses; a bad one is named.
    #[test]
    fn peers_are_a_list_of_addresses() {
        let mut cfg = MessengerConfig::default();
        cfg.set("peers", "tcp://127.0.0.1:6800, tcp://[::1]:6801")
            .unwrap();
        assert_eq!(cfg.peers.len(), 2);
        let e = cfg.set("peers", "tcp://127.0.0.1:1,bogus").unwrap_err();
        assert!(e.to_string().contains("`bogus`"), "{e}");
        cfg.set("peers", "").unwrap();
        assert!(cfg.peers.is_empty());
    }

    /// Values that cannot work are refused at start, with the range.
    #[test]
    fn values_outside_their_range_are_refused_with_it() {
        for (key, bad) in [
            ("handshake_timeout_ms", "0"),
            ("keepalive_timeout_ms", "0"),
            ("keepalive_interval_ms", "18446744073709551615"),
            ("backoff_min_ms", "0"),
            ("max_handshakes", "0"),
            ("max_data_bytes", "0"),
            ("max_front_bytes", "0"),
            ("max_queued_messages", "0"),
            ("rx_throttle_bytes", "0"),
            ("busy_poll_us", "99999999999"),
        ] {
            let e = MessengerConfig::default()
                .set(key, bad)
                .expect_err(key)
                .to_string();
            assert!(
                e.contains("must be") && e.contains("..="),
                "{key}={bad}: {e}"
            );
        }
    }

    #[test]
    fn batch_max_bytes_is_zero_or_within_a_header_segment() {
        let mut cfg = MessengerConfig::default();
        assert_eq!(cfg.session.batch_max_bytes, 16 << 10);
        cfg.set("batch_max_bytes", "0").unwrap();
        assert_eq!(cfg.session.batch_max_bytes, 0);
        cfg.set("batch_max_bytes", "65536").unwrap();
        for bad in ["1", "255", "65537"] {
            let e = cfg.set("batch_max_bytes", bad).unwrap_err().to_string();
            assert!(e.contains("256 to 65536"), "{bad}: {e}");
        }
        assert_eq!(cfg.session.batch_max_bytes, 65536);
    }

    #[test]
    fn payload_crc_is_a_boolean() {
        let mut cfg = MessengerConfig::default();
        assert!(cfg.session.payload_crc);
        cfg.set("payload_crc", "false").unwrap();
        assert!(!cfg.session.payload_crc);
        cfg.set("payload_crc", "on").unwrap();
        assert!(cfg.session.payload_crc);
        assert!(matches!(
            cfg.set("payload_crc", "maybe"),
            Err(ConfigError::BadValue { .. })
        ));
    }

    #[test]
    fn rdma_read_timeout_is_milliseconds_and_never_zero() {
        let mut cfg = MessengerConfig::default();
        cfg.set("rdma_read_timeout_ms", "2000").unwrap();
        assert_eq!(cfg.rdma.read_timeout, Duration::from_secs(2));
        let err = cfg
            .set("rdma_read_timeout_ms", "0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("rdma_read_timeout_ms"), "{err}");
        assert_eq!(cfg.rdma.read_timeout, Duration::from_secs(2));
    }

    /// 0 is the backend's default, not IB's "never time out"; codes
    /// beyond the verbs field's 5 bits and retries beyond 7 are refused.
    #[test]
    fn rdma_ack_timeout_and_retries_stay_in_the_verbs_ranges() {
        let mut cfg = MessengerConfig::default();
        assert_eq!((cfg.rdma.ack_timeout, cfg.rdma.retry_count), (None, 7));
        cfg.set("rdma_ack_timeout", "18").unwrap();
        cfg.set("rdma_retry_count", "2").unwrap();
        assert_eq!((cfg.rdma.ack_timeout, cfg.rdma.retry_count), (Some(18), 2));
        cfg.set("rdma_ack_timeout", "0").unwrap();
        assert_eq!(cfg.rdma.ack_timeout, None);
        assert!(cfg.set("rdma_ack_timeout", "32").is_err());
        assert!(cfg.set("rdma_retry_count", "8").is_err());
        assert_eq!(cfg.rdma.retry_count, 2);
    }

    #[test]
    fn fabric_rendezvous_is_auto_off_on_or_write() {
        use msgr_backends::FabricRendezvous as R;
        let mut cfg = MessengerConfig::default();
        assert_eq!(cfg.rdma.fabric_rendezvous, R::Auto);
        for (v, want) in [
            ("off", R::Off),
            ("on", R::On),
            ("write", R::Write),
            ("auto", R::Auto),
        ] {
            cfg.set("fabric_rendezvous", v).unwrap();
            assert_eq!(cfg.rdma.fabric_rendezvous, want);
        }
        let err = cfg.set("fabric_rendezvous", "yes").unwrap_err().to_string();
        assert!(err.contains("fabric_rendezvous"), "{err}");
        assert_eq!(cfg.rdma.fabric_rendezvous, R::Auto);
    }

    #[test]
    fn fabric_cq_wait_is_fd_or_poll() {
        use msgr_backends::FabricCqWait as W;
        let mut cfg = MessengerConfig::default();
        assert_eq!(cfg.rdma.fabric_cq_wait, W::Fd);
        cfg.set("fabric_cq_wait", "poll").unwrap();
        assert_eq!(cfg.rdma.fabric_cq_wait, W::Poll);
        let err = cfg.set("fabric_cq_wait", "spin").unwrap_err().to_string();
        assert!(
            err.contains("fabric_cq_wait") && err.contains("fd or poll"),
            "{err}"
        );
        assert_eq!(cfg.rdma.fabric_cq_wait, W::Poll);
        cfg.set("fabric_cq_wait", "fd").unwrap();
        assert_eq!(cfg.rdma.fabric_cq_wait, W::Fd);
    }

    #[test]
    fn file_keys_apply_and_errors_name_the_key() {
        let cfg =
            load("workers = 3\npolicy = \"lossy-client\"\nkeepalive_timeout_ms = 250\n").unwrap();
        assert_eq!(cfg.workers, 3);
        assert_eq!(cfg.policy, Policy::LossyClient);
        assert_eq!(cfg.session.keepalive_timeout, Duration::from_millis(250));
        assert_eq!(cfg.rdma.read_timeout, Duration::from_secs(10));
        let err = load_error("workers = \"many\"\n");
        assert!(err.contains("workers") && err.contains("many"), "{err}");
    }

    /// `text` read as a configuration file (a temporary one of its own).
    fn load(text: &str) -> Result<MessengerConfig, ConfigError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "msgr-cfg-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).unwrap();
        let cfg = MessengerConfig::from_file(&path);
        std::fs::remove_file(&path).unwrap();
        cfg
    }

    /// [`load`]'s error, as printed.
    fn load_error(text: &str) -> String {
        load(text).expect_err(text).to_string()
    }

    /// A file's arrays give a list key its items; a key of one value
    /// refuses them.
    #[test]
    fn file_arrays_set_list_keys() {
        let cfg = load(
            "bind = [\"tcp://127.0.0.1:0\", \"tcp://[::1]:0\"]\n\
             peers = [\"tcp://127.0.0.1:6800\", \"tcp://127.0.0.1:6801\"]\n\
             security = [\"crc\", \"secure\"]\n",
        )
        .unwrap();
        assert_eq!(cfg.bind.len(), 2);
        assert_eq!(cfg.peers.len(), 2);
        let mut want = MessengerConfig::default();
        want.set("security", "crc,secure").unwrap();
        assert_eq!(cfg.session.security.modes, want.session.security.modes);
        let e = load_error("workers = [1, 2]\n");
        assert!(e.contains("`workers` takes one value, not a list"), "{e}");
        let e = load_error("peers = [\"tcp://127.0.0.1:1\", \"bogus\"]\n");
        assert!(e.contains("`bogus`"), "{e}");
    }

    /// An unquoted string (TOML reads `tcp://…` as a misspelt `true`) is
    /// refused with the line and how to quote it; an unknown key in a
    /// file or `set` names the likely one.
    #[test]
    fn file_mistakes_say_how_to_fix_them() {
        let e = load_error("workers = 2\nbind = tcp://127.0.0.1:6800\n");
        assert!(
            e.contains("line 2")
                && e.contains("strings must be quoted: bind = \"tcp://127.0.0.1:6800\"")
                && !e.contains('\n'),
            "{e}"
        );
        let e = load_error("policy = lossy-client # a comment\n");
        assert!(
            e.contains("strings must be quoted: policy = \"lossy-client\""),
            "{e}"
        );
        // Another syntax error gets no such hint.
        let e = load_error("workers = 2\n[[[\n");
        assert!(!e.contains("must be quoted"), "{e}");
        let e = load_error("wokers = 2\n");
        assert!(e.contains("did you mean `workers`?"), "{e}");
        let e = MessengerConfig::default()
            .set("max_data_byte", "1")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "unknown configuration key `max_data_byte`: did you mean `max_data_bytes`?"
        );
    }

    /// docs/CONFIG.md is made from [`CONFIG_KEYS`] (name, values, what it
    /// does): the test fails while they differ, so neither can drift;
    /// `MSGR_TEST_BLESS=1` writes it anew.
    #[test]
    fn config_doc_is_generated_from_the_keys() {
        let mut doc = String::from(
            "# Configuration keys\n\n\
             Generated from `msgr::CONFIG_KEYS` (messenger/src/config/keys.rs), the one table \
             `MessengerConfig::set`, the environment check and this page come from: \
             `MSGR_TEST_BLESS=1 cargo test -p msgr --lib config_doc` \
             writes it again, and the test fails while they differ.\n\n\
             Each key can be set in code (`MessengerConfig::set`), in a TOML file of \
             flat `key = value` lines (`MessengerConfig::from_file`, or \
             `MSGR_CONFIG=path`), or as an environment variable `MSGR_<KEY>` \
             (`MSGR_WORKERS=2`). A messenger built without `.config(..)` reads \
             `MSGR_CONFIG` and `MSGR_*` itself (`.without_env()` opts out). In a file, \
             text is quoted (`bind = \"tcp://127.0.0.1:6800\"`) and a list is a TOML \
             array (`peers = [\"tcp://10.0.0.2:6800\", \"tcp://10.0.0.3:6800\"]`); \
             elsewhere a list is comma-separated. Every \
             value is checked at start and refused with its allowed range; an \
             unknown key is an error, except the test harness's reserved prefixes \
             (`MSGR_IN_GUEST`, `MSGR_GUEST_`, `MSGR_STRESS_`, `MSGR_TEST_`).\n\n\
             | Key | Values | Meaning (default) |\n|---|---|---|\n",
        );
        for k in CONFIG_KEYS {
            doc.push_str(&format!(
                "| `{}` | {} | {} |\n",
                k.name,
                k.values().replace('|', "\\|"),
                k.doc.replace('|', "\\|")
            ));
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md");
        if std::env::var_os("MSGR_TEST_BLESS").is_some() {
            std::fs::write(&path, &doc).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == doc,
            "docs/CONFIG.md is not what CONFIG_KEYS says: run with MSGR_TEST_BLESS=1"
        );
    }
}
