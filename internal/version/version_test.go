package version_test

import (
	"testing"

	"github.com/cairn-hpc/cairn/internal/version"

	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		v    version.Info
		want string
	}{
		{version.Info{Version: "devel", Go: "go1.26", API: "v1"}, "cairn devel, go1.26, API v1"},
		{version.Info{Version: "v0.3.0", Revision: "0123456789abcdef", Modified: true, Go: "go1.26", API: "v1"}, "cairn v0.3.0 (0123456789ab, modified), go1.26, API v1"},
		{version.Info{Version: "devel", Revision: "abc", Go: "go1.26", API: "v1"}, "cairn devel (abc), go1.26, API v1"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.v, got, tc.want)
		}
	}
	if v := version.Get(); v.API != version.API || v.Go == "" || v.Version == "" {
		t.Errorf("Get() = %+v", v)
	}
}

// TestAPIIsTheWires: the API version a build reports is the one its
// agents say at join and its coordinators check.
func TestAPIIsTheWires(t *testing.T) {
	if version.API != coordv1.APIVersion {
		t.Errorf("version.API %s, coordv1.APIVersion %s", version.API, coordv1.APIVersion)
	}
}
