package raftlock

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readmeBlocks returns the fenced blocks of README.md in lang, in order.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?ms)^```"+lang+"\n(.*?)^```$").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

func nonEmptyLines(s string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}

// The README's "Install and a first lock" is under ten lines and works as
// written: its `go mod edit` line, run in a fresh module beside this
// checkout, and its code, built there (GOPROXY=off: nothing downloaded)
// and run against the shared cluster, take the lock and give it back.
func TestReadmeFirstLock(t *testing.T) {
	install, code := readmeBlocks(t, "sh")[0], readmeBlocks(t, "go")[0]
	if n := nonEmptyLines(install) + nonEmptyLines(code); n >= 10 {
		t.Fatalf("install and a first lock take %d lines, want under ten", n)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	checkout, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	env := append(os.Environ(), "GOPROXY=off", "GOFLAGS=")
	sh := func(script string) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir, cmd.Env = app, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	sh(strconv.Quote(goBin) + " mod init example.com/readme")
	if !strings.Contains(install, "../raftlock/") {
		t.Fatalf("the install block does not name ../raftlock/: %s", install)
	}
	sh(strings.ReplaceAll(strings.ReplaceAll(install, "../raftlock/", checkout+"/"), "go mod edit", strconv.Quote(goBin)+" mod edit"))

	lines := strings.SplitN(code, "\n", 2)
	if !strings.HasPrefix(lines[0], "import ") {
		t.Fatalf("the first Go block does not start with its import: %q", lines[0])
	}
	endpoints := regexp.MustCompile(`"10\.0\.0\.[^"]*"`)
	if !endpoints.MatchString(lines[1]) {
		t.Fatalf("no endpoint list in the first Go block: %s", lines[1])
	}
	body := endpoints.ReplaceAllLiteralString(lines[1], strconv.Quote(shared(t).endpoints()))
	main := "package main\n\n" + lines[0] + "\n\nimport (\n\t\"context\"\n\t\"fmt\"\n\t\"os\"\n)\n\n" +
		"func run(ctx context.Context) error {\n" + body + "\tfmt.Println(\"locked\")\n\treturn nil\n}\n\n" +
		"func main() {\n\tif err := run(context.Background()); err != nil {\n\t\tfmt.Println(err)\n\t\tos.Exit(1)\n\t}\n}\n"
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	sh(strconv.Quote(goBin) + " build -o readme .")
	cmd := exec.Command(filepath.Join(app, "readme"))
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "locked" {
		t.Fatalf("the README's first lock: %v, output %q\n%s", err, out, main)
	}
	c := newClient(t, shared(t).endpoints(), Options{})
	eventually(t, 5*time.Second, "repo/42 free after the README's program", func() bool {
		d := describe(t, c, "repo/42")
		return len(d.Info.Holders) == 0 && len(d.Info.Waiters) == 0
	})
}
