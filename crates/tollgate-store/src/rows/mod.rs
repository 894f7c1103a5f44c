//! What each table keeps, one module per table: its rows, the requests that write them and the
//! outcomes those writes report. Everything is re-exported at the crate root.

mod api_key;
mod audit;
mod evidence;
mod execution;
mod result;
mod root;
mod settlement;

pub use api_key::*;
pub use audit::*;
pub use evidence::*;
pub use execution::*;
pub use result::*;
pub use root::*;
pub use settlement::*;
