mod debug_altlink;
mod debug_link;
mod debug_sup;
mod function;
mod lines;
mod location;
mod range;
mod reader;
mod relocate;
mod resolver;
mod unit;
mod units;


pub(crate) use self::resolver::DwarfResolver;
