//! margay's BGP-4 wire codec (to be written: see issue 5).
