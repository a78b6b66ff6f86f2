package mpi

import (
	"testing"

	"github.com/cairn-hpc/cairn/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
