package raid

// SetUnsafeReference is a test-only switch: WriteAt then skips the copy and keeps references
// to the caller's buffer as if it were pinned, without any promise that it stays unchanged.
// It exists to show the hazard that stable pages and pinning avoid; never use it otherwise.
func SetUnsafeReference(a *Array, on bool) { a.unsafeRef = on }
