package runtime

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// unmountUnder lazily unmounts everything mounted below dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(unescapeMount(fields[4]), dir+"/") {
			mps = append(mps, unescapeMount(fields[4]))
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mps[i], syscall.MNT_DETACH); err != nil {
			t.Logf("unmount %s: %v", mps[i], err)
		}
	}
}

var octal = regexp.MustCompile(`\\[0-7]{3}`)

func unescapeMount(s string) string {
	return octal.ReplaceAllStringFunc(s, func(o string) string {
		n, _ := strconv.ParseUint(o[1:], 8, 8)
		return string(rune(n))
	})
}
