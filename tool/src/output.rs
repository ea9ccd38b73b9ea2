//! Standard output that its reader may close: `msgr ping … | head -1`,
//! `| true`. `println!` panics on the closed pipe (Rust ignores SIGPIPE, so
//! the write fails with EPIPE); every line the tool prints goes through
//! here instead, and a reader that went is no error of ours: the command
//! runs to its end and exits 0, its output dropped.

use std::io::Write;

use crate::error::ToolError;

/// Writes to stdout with `f` and flushes; a closed pipe is not an error.
pub fn write_stdout(
    f: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>,
) -> Result<(), ToolError> {
    let mut out = std::io::stdout().lock();
    match f(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(ToolError::io("stdout", e)),
        _ => Ok(()),
    }
}

/// [`write_stdout`] of formatted text: what [`outln!`] calls.
pub fn write_fmt(args: std::fmt::Arguments<'_>) -> Result<(), ToolError> {
    write_stdout(|out| out.write_fmt(args))
}

/// `println!` for a stdout whose reader may go: a `Result` (`?` it), never
/// a panic ([`write_stdout`]).
macro_rules! outln {
    () => {
        $crate::output::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;
