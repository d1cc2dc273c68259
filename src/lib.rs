pub mod app;
pub mod cli;
pub mod core;
pub mod duration;
pub mod selector;
pub mod tools;
