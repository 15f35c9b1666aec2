//! Progress bars of the long commands (gate, sweep, bench): drawn on stderr only when stderr
//! is a terminal, so piped output, `--json` and CI logs stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` steps named `what` (e.g. "simulations"), with the current item as its
/// message; hidden when stderr is not a terminal.
pub fn bar(len: usize, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    let template = format!("{{bar:30}} {{pos}}/{{len}} {what} ({{elapsed}}, eta {{eta}}) {{msg}}");
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}
