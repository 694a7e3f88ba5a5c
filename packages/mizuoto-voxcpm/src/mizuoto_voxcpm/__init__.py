"""Engine plugin."""
