#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| shardflow::fuzz::run("media", data));
