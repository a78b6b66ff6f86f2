package deploy

import (
	"testing"

	"cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
