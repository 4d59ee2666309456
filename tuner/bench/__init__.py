"""`tune bench`: a CI regression gate over fixed configs of a suite."""
