package limiter

import "testing"

func TestNew(t *testing.T) {}

func TestDefaultRate(t *testing.T) {}
