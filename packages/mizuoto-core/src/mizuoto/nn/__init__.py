"""Neural-network building blocks shared by the engines.

``dsp`` holds signal processing (mel features, resampling, audio files, tiled decoding);
``transformer``, ``flow`` and ``vocoders`` hold model blocks. An engine package keeps only
what is its own and builds the rest from here.
"""
