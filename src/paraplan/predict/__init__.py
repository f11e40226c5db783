"""Real-scale LLM training prediction: transformer work per layer (`ops`), the
calibrated device model (`device_model`, `calibrate`, `calibration`), the execution
model builder (`build`), run tables (`runtable`, `vtrain`) and the predictor."""
