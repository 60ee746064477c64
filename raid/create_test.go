package raid_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/stripe"
)

// TestCreateRefusalLeavesNothing: a Create that fails removes the member files it made, and
// options it can check up front (policy, chunk, layout) are refused before any file exists.
func TestCreateRefusalLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts raid.CreateOptions
		want error
	}{
		{"unknown policy", raid.CreateOptions{MemberSize: 8 << 20, Consistency: "ppl"}, raid.ErrConsistency},
		{"bad chunk", raid.CreateOptions{MemberSize: 8 << 20, Chunk: 3000}, stripe.ErrChunk},
		{"bad layout", raid.CreateOptions{MemberSize: 8 << 20, Layout: "diagonal"}, stripe.ErrAlgorithm},
		{"members too small", raid.CreateOptions{MemberSize: raid.DataOffset + 4096}, raid.ErrMemberTooSmall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			paths := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")}
			if _, err := raid.Create(paths, tc.opts); !errors.Is(err, tc.want) {
				t.Fatalf("Create: %v, want %v", err, tc.want)
			}
			for _, p := range paths {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind by a refused Create (%v)", p, err)
				}
			}
		})
	}
}
