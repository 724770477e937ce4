mod inline;
mod linetab;
mod parser;
mod resolver;
mod types;

pub(crate) use resolver::GsymResolver;
