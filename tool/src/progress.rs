//! A progress bar on stderr that appears only on a terminal, only when not
//! printing JSON, and only once a run has lasted more than a second.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress of one long run (or of a series of phases).
pub struct Progress {
    bar: ProgressBar,
    allowed: bool,
    started: Instant,
    shown: bool,
}

impl Progress {
    /// A bar for `len` units; `json` (or stderr not being a terminal) hides it.
    pub fn new(len: u64, json: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
        ) {
            bar.set_style(style);
        }
        Progress {
            bar,
            allowed: !json && std::io::stderr().is_terminal(),
            started: Instant::now(),
            shown: false,
        }
    }

    fn maybe_show(&mut self) {
        if self.allowed && !self.shown && self.started.elapsed() > Duration::from_secs(1) {
            self.shown = true;
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Sets the length.
    pub fn set_length(&mut self, len: u64) {
        self.bar.set_length(len);
        self.bar.set_position(0);
    }

    /// Sets the position.
    pub fn set(&mut self, pos: u64) {
        self.bar.set_position(pos);
        self.maybe_show();
    }

    /// Sets the message shown after the bar.
    pub fn message(&mut self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
        self.maybe_show();
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
