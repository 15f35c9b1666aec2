//! Writes the files of a simulation report into a directory.

use crate::chrome_trace::chrome_trace_json;
use crate::csv::{summary_csv, timeline_csv};
use crate::html::sim_report_html;
use crate::model::SimReport;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// A report file or directory could not be written.
#[derive(Debug, Error)]
pub enum ReportError {
    /// Creating the output directory failed.
    #[error("cannot create report directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Writing a report file failed.
    #[error("cannot write report file {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
}

/// File names written by [`write_sim_report`], in order.
pub const SIM_REPORT_FILES: [&str; 4] =
    ["report.html", "summary.csv", "timeline.csv", "trace.json"];

/// Writes `report.html`, `summary.csv`, `timeline.csv` and `trace.json` into `dir` (created
/// with its parents when missing, existing files replaced) and returns their paths in that
/// order. Errors name the directory or file that failed.
pub fn write_sim_report(dir: &Path, report: &SimReport) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let contents = [
        sim_report_html(report),
        summary_csv(report),
        timeline_csv(report),
        chrome_trace_json(report),
    ];
    let mut written = Vec::with_capacity(contents.len());
    for (name, text) in SIM_REPORT_FILES.iter().zip(contents) {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| ReportError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}
