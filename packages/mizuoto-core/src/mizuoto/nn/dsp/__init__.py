"""Signal processing shared by the engines.

- :mod:`~mizuoto.nn.dsp.mel`: mel filterbank and (log-)mel spectrogram, bit-identical to
  torchaudio's ``MelSpectrogram`` and the Vocos / F5-TTS features built on it.
- :mod:`~mizuoto.nn.dsp.resample`: windowed-sinc resampling, bit-identical to torchaudio's.
- :mod:`~mizuoto.nn.dsp.soxr_resample`: soxr resampling and file loading as librosa does them.
- :mod:`~mizuoto.nn.dsp.audio_io`: reading, checking and writing audio files.
- :mod:`~mizuoto.nn.dsp.reference`: a reference recording read, mixed down and resampled.
- :mod:`~mizuoto.nn.dsp.tiles`: decoding long frame sequences in overlapping tiles.
"""
