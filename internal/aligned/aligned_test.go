package aligned

import "testing"

func TestMake(t *testing.T) {
	for _, align := range []int{512, Align, 1 << 16} {
		for _, n := range []int{1, 17, 512, 4095, 4096, 4097, 12288, 65536, 1<<20 + 3} {
			// Several at once, so that small ones share heap spans and land unaligned.
			var keep [][]byte
			for range 8 {
				b := MakeAligned(n, align)
				if len(b) != n || cap(b) != n {
					t.Fatalf("MakeAligned(%d, %d): len %d cap %d", n, align, len(b), cap(b))
				}
				if !Is(b, align) {
					t.Fatalf("MakeAligned(%d, %d) = %p, not aligned", n, align, b)
				}
				for i, c := range b {
					if c != 0 {
						t.Fatalf("MakeAligned(%d, %d)[%d] = %d, want 0", n, align, i, c)
					}
				}
				keep = append(keep, b, make([]byte, 24)) // a small allocation between them
			}
			_ = keep
		}
	}
	if b := Make(0); len(b) != 0 {
		t.Fatalf("Make(0) has %d bytes", len(b))
	}
}

func TestIs(t *testing.T) {
	b := Make(2 * Align)
	if !Is(b, Align) || Is(b[1:], Align) || !Is(b[Align:], Align) || !Is(b[8:], 8) || !Is(nil, Align) {
		t.Fatal("Is disagrees with the offsets it was given")
	}
}
