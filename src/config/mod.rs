//! Configuration: the command line and environment (`cli`), the table of flags the chart and the README
//! are checked against (`flags`), and the scope they select (`scope`,
//! `selector`).
pub mod cli;
pub mod flags;
pub mod scope;
pub mod selector;

pub use cli::*;
