//! Configuration: the command line and environment (`cli`), and the scope they select (`scope`,
//! `selector`).
pub mod cli;
pub mod scope;
pub mod selector;

pub use cli::*;
