"""Runtime: device and dtype choice, threads and allocator, compile, checkpoint loading."""
