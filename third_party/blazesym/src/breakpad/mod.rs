mod file;
mod parser;
mod resolver;
mod types;

pub use resolver::BreakpadResolver;
