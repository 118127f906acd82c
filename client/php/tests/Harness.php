<?php

// The PHP suite's harness: a real raftlock cluster (`raftlockd dev`, three
// nodes on free loopback ports in a temporary directory, from $RAFTLOCKD,
// default the workspace's target/debug/raftlockd), worker processes, and
// polling with deadlines. Nothing is mocked.

declare(strict_types=1);

namespace Raftlock\Tests;

final class TestFailure extends \RuntimeException
{
}

function check(bool $cond, string $what): void
{
    if (!$cond) {
        throw new TestFailure($what);
    }
}

function checkSame($want, $got, string $what): void
{
    if ($want !== $got) {
        throw new TestFailure($what.': want '.var_export($want, true).', got '.var_export($got, true));
    }
}

/**
 * Runs $f and checks that it throws a $class (or something whose chain of
 * previous exceptions holds one) whose message contains $text.
 */
function checkThrows(string $class, string $text, callable $f): \Throwable
{
    try {
        $f();
    } catch (\Throwable $e) {
        for ($x = $e; null !== $x; $x = $x->getPrevious()) {
            if ($x instanceof $class && str_contains($x->getMessage(), $text)) {
                return $x;
            }
        }
        throw new TestFailure("want a $class with \"$text\", got ".\get_class($e).': '.$e->getMessage(), 0, $e);
    }
    throw new TestFailure("want a $class with \"$text\", nothing was thrown");
}

/** Polls $cond every 20 ms until it returns true, or fails after $within seconds. */
function eventually(float $within, string $what, callable $cond): void
{
    $deadline = microtime(true) + $within;
    while (!$cond()) {
        if (microtime(true) > $deadline) {
            throw new TestFailure("not within $within s: $what");
        }
        usleep(20000); // polling interval, under the deadline
    }
}

function raftlockd(): string
{
    return getenv('RAFTLOCKD') ?: \dirname(__DIR__, 3).'/target/debug/raftlockd';
}

/** A `raftlockd dev` cluster. */
final class Cluster
{
    /** @var array<int, string> node id => address */
    public array $nodes = [];
    private $proc;
    private $stdout;
    private string $dir;

    /** @param list<string> $extra more flags for `raftlockd dev` */
    public function __construct(array $extra = [])
    {
        $bin = raftlockd();
        if (!is_executable($bin)) {
            throw new \RuntimeException("no raftlockd at $bin (build it with `cargo build -p raftlock-node --bin raftlockd`, or set RAFTLOCKD)");
        }
        $last = '';
        for ($try = 0; $try < 5; ++$try) {
            $this->dir = sys_get_temp_dir().'/raftlock-php-'.bin2hex(random_bytes(6));
            mkdir($this->dir);
            $base = self::freeBase(3);
            $cmd = array_merge([$bin, 'dev', '--nodes', '3', '--base-port', (string) $base, '--data-dir', $this->dir, '--metrics-base-port', '0'], $extra);
            $this->proc = proc_open($cmd, [0 => ['pipe', 'r'], 1 => ['pipe', 'w'], 2 => ['file', $this->dir.'/dev.log', 'a']], $pipes, null, ['RUST_LOG' => 'warn'] + getenv());
            $this->stdout = $pipes[1];
            $deadline = microtime(true) + 30;
            $ready = false;
            while (microtime(true) < $deadline) {
                $r = [$this->stdout];
                $w = $e = null;
                if (0 === stream_select($r, $w, $e, 0, 200000)) {
                    continue;
                }
                $line = fgets($this->stdout);
                if (false === $line) {
                    break; // it exited (a port was taken meanwhile)
                }
                if (preg_match('/^node (\d+) (\S+)$/', trim($line), $m)) {
                    $this->nodes[(int) $m[1]] = $m[2];
                } elseif ('ready' === trim($line)) {
                    $ready = true;
                    break;
                }
            }
            if ($ready) {
                return;
            }
            $last = @file_get_contents($this->dir.'/dev.log') ?: '';
            $this->stop();
            $this->nodes = [];
        }
        throw new \RuntimeException("raftlockd dev did not start: $last");
    }

    /** A base port with $n free ports from it. */
    public static function freeBase(int $n): int
    {
        while (true) {
            $base = random_int(20000, 60000);
            $held = [];
            foreach (range($base, $base + $n - 1) as $port) {
                $s = @stream_socket_server("tcp://127.0.0.1:$port");
                if (false === $s) {
                    break;
                }
                $held[] = $s;
            }
            $ok = \count($held) === $n;
            foreach ($held as $s) {
                fclose($s);
            }
            if ($ok) {
                return $base;
            }
        }
    }

    public function endpoints(): string
    {
        return implode(',', array_map(fn ($a) => "http://$a", $this->nodes));
    }

    /** The leader's address, as node 1 sees it (polling until one is known). */
    public function leader(): string
    {
        $leader = '';
        eventually(10, 'a leader', function () use (&$leader) {
            $ctx = stream_context_create(['http' => ['method' => 'POST', 'header' => "Content-Type: application/json\r\n", 'content' => '{}', 'ignore_errors' => true, 'timeout' => 2]]);
            $s = json_decode((string) @file_get_contents('http://'.$this->nodes[1].'/v1/cluster/Status', false, $ctx), true);
            $leader = $s['leader_addr'] ?? '';

            return '' !== $leader;
        });

        return $leader;
    }

    public function stop(): void
    {
        if (\is_resource($this->proc)) {
            proc_terminate($this->proc, 15);
            $deadline = microtime(true) + 10;
            while (proc_get_status($this->proc)['running'] && microtime(true) < $deadline) {
                usleep(20000);
            }
            if (proc_get_status($this->proc)['running']) {
                proc_terminate($this->proc, 9);
            }
            proc_close($this->proc);
        }
        exec('rm -rf '.escapeshellarg($this->dir));
    }
}

/** What node $addr's Status answers, or null if it does not answer. */
function nodeStatus(string $addr): ?array
{
    $ctx = stream_context_create(['http' => ['method' => 'POST', 'header' => "Content-Type: application/json\r\n", 'content' => '{}', 'ignore_errors' => true, 'timeout' => 2]]);
    $s = json_decode((string) @file_get_contents("http://$addr/v1/cluster/Status", false, $ctx), true);

    return \is_array($s) ? $s : null;
}

/**
 * A three-node cluster of `raftlockd run` processes, one per node (on free
 * loopback ports, in a temporary directory), so that one node can be
 * killed alone and started again.
 */
final class NodeProcesses
{
    /** @var array<int, string> node id => address */
    public array $nodes = [];
    /** @var array<int, resource> node id => its process, while it runs */
    private array $procs = [];
    private string $dir = '';

    public function __construct(int $n = 3)
    {
        $bin = raftlockd();
        if (!is_executable($bin)) {
            throw new \RuntimeException("no raftlockd at $bin (build it with `cargo build -p raftlock-node --bin raftlockd`, or set RAFTLOCKD)");
        }
        $last = '';
        for ($try = 0; $try < 5; ++$try) {
            $this->dir = sys_get_temp_dir().'/raftlock-php-nodes-'.bin2hex(random_bytes(6));
            mkdir($this->dir);
            $base = Cluster::freeBase($n);
            $this->nodes = [];
            foreach (range(1, $n) as $id) {
                $this->nodes[$id] = '127.0.0.1:'.($base + $id - 1);
            }
            // Node 1 bootstraps: start it last, so that its first election
            // finds its peers listening.
            foreach (array_reverse(array_keys($this->nodes)) as $id) {
                $this->start($id);
            }
            try {
                $this->leaderId(30);

                return;
            } catch (TestFailure $e) {
                // A port taken meanwhile, or a slow start: say why, try again.
                $last = $e->getMessage().': '.$this->logs();
                $this->stop();
            }
        }
        throw new \RuntimeException("raftlockd run did not make a cluster: $last");
    }

    private function start(int $id): void
    {
        $peers = implode(',', array_map(fn ($i, $a) => "$i=$a", array_keys($this->nodes), $this->nodes));
        $cmd = [raftlockd(), 'run', '--id', (string) $id, '--listen', $this->nodes[$id], '--data-dir', $this->dir."/node-$id",
            '--peers', $peers, '--insecure-peers'];
        if (1 === $id) {
            $cmd[] = '--init';
        }
        $log = $this->dir."/node-$id.log";
        $this->procs[$id] = proc_open($cmd, [0 => ['file', '/dev/null', 'r'], 1 => ['file', $log, 'a'], 2 => ['file', $log, 'a']], $pipes, null, ['RUST_LOG' => 'warn'] + getenv());
    }

    public function endpoints(): string
    {
        return implode(',', array_map(fn ($a) => "http://$a", $this->nodes));
    }

    /** The id of the node that says it is a working leader, polling the running nodes until one does. */
    public function leaderId(float $within = 10): int
    {
        $leader = 0;
        eventually($within, 'a node that leads', function () use (&$leader) {
            foreach (array_keys($this->procs) as $id) {
                if ('leader' === (nodeStatus($this->nodes[$id])['role'] ?? '')) {
                    $leader = $id;

                    return true;
                }
            }

            return false;
        });

        return $leader;
    }

    /** Kills node $id's process (SIGKILL) and waits for it to end. */
    public function kill(int $id): void
    {
        $proc = $this->procs[$id];
        unset($this->procs[$id]);
        proc_terminate($proc, 9);
        eventually(10, "node $id's process to end", fn () => !proc_get_status($proc)['running']);
        proc_close($proc);
    }

    /** Sends $signal to node $id's process (SIGSTOP hangs it, SIGCONT resumes it). */
    public function signal(int $id, int $signal): void
    {
        posix_kill(proc_get_status($this->procs[$id])['pid'], $signal);
    }

    /** Starts again every node that was killed, and waits for a leader. */
    public function restartKilled(): void
    {
        $dead = array_diff(array_keys($this->nodes), array_keys($this->procs));
        foreach ($dead as $id) {
            $this->start($id);
        }
        if ($dead) {
            $this->leaderId(30);
        }
    }

    /** The tail of every node's log, for a failure's message. */
    public function logs(): string
    {
        $out = [];
        foreach (array_keys($this->nodes) as $id) {
            $log = (string) @file_get_contents($this->dir."/node-$id.log");
            $out[] = "node $id: ".substr($log, -2000);
        }

        return implode(' | ', $out);
    }

    /** Ends every node (SIGKILL: the cluster and its data are thrown away). */
    public function stop(): void
    {
        foreach (array_keys($this->procs) as $id) {
            $this->kill($id);
        }
        if ('' !== $this->dir) {
            exec('rm -rf '.escapeshellarg($this->dir));
        }
    }
}

/** A worker process (tests/worker.php) printing one line per event. */
final class Worker
{
    private $proc;
    private array $pipes = [];
    public int $pid;

    /** @param list<string> $args */
    public function __construct(array $args)
    {
        $this->proc = proc_open(array_merge([\PHP_BINARY, __DIR__.'/worker.php'], $args), [0 => ['pipe', 'r'], 1 => ['pipe', 'w'], 2 => STDERR], $this->pipes);
        $this->pid = proc_get_status($this->proc)['pid'];
    }

    /** Waits for the worker's next line and checks that it starts with $prefix. */
    public function expect(string $prefix, float $within = 15): string
    {
        $deadline = microtime(true) + $within;
        while (microtime(true) < $deadline) {
            $r = [$this->pipes[1]];
            $w = $e = null;
            $left = max(0.0, $deadline - microtime(true));
            if (0 === stream_select($r, $w, $e, (int) $left, (int) (fmod($left, 1.0) * 1e6))) {
                continue;
            }
            $line = fgets($this->pipes[1]);
            if (false === $line) {
                throw new TestFailure("the worker ended before printing \"$prefix\"");
            }
            $line = rtrim($line, "\n");
            check(str_starts_with($line, $prefix), "the worker printed \"$line\", want \"$prefix...\"");

            return $line;
        }
        throw new TestFailure("the worker printed nothing within $within s (want \"$prefix\")");
    }

    public function send(string $line): void
    {
        fwrite($this->pipes[0], $line."\n");
        fflush($this->pipes[0]);
    }

    public function kill(): void
    {
        posix_kill($this->pid, 9);
    }

    public function close(): void
    {
        if (\is_resource($this->proc)) {
            if (proc_get_status($this->proc)['running']) {
                proc_terminate($this->proc, 9);
            }
            foreach ($this->pipes as $p) {
                if (\is_resource($p)) {
                    fclose($p);
                }
            }
            proc_close($this->proc);
        }
    }

    public function __destruct()
    {
        $this->close();
    }
}

/** A stand-in node (tests/standin.php MODE) and the events it printed. */
final class StandIn
{
    private $proc;
    private array $pipes = [];
    private string $buf = '';
    /** @var list<string> */
    private array $events = [];
    public int $port = 0;

    public function __construct(string $mode)
    {
        $this->proc = proc_open([\PHP_BINARY, __DIR__.'/standin.php', $mode], [0 => ['pipe', 'r'], 1 => ['pipe', 'w'], 2 => STDERR], $this->pipes);
        stream_set_blocking($this->pipes[1], false);
        eventually(15, 'the stand-in listening', function (): bool {
            $this->read();

            return $this->port > 0;
        });
    }

    public function endpoint(): string
    {
        return "127.0.0.1:$this->port";
    }

    /** Sends the stand-in a line (e.g. "silent"). */
    public function send(string $line): void
    {
        fwrite($this->pipes[0], $line."\n");
        fflush($this->pipes[0]);
    }

    /** @return list<string> every event printed so far, in order */
    public function events(): array
    {
        $this->read();

        return $this->events;
    }

    private function read(): void
    {
        while (\is_string($chunk = fread($this->pipes[1], 65536)) && '' !== $chunk) {
            $this->buf .= $chunk;
        }
        while (false !== ($nl = strpos($this->buf, "\n"))) {
            $line = substr($this->buf, 0, $nl);
            $this->buf = substr($this->buf, $nl + 1);
            if (str_starts_with($line, 'PORT ')) {
                $this->port = (int) substr($line, 5);
            } else {
                $this->events[] = $line;
            }
        }
    }

    public function __destruct()
    {
        if (\is_resource($this->proc)) {
            proc_terminate($this->proc, 9);
            foreach ($this->pipes as $p) {
                if (\is_resource($p)) {
                    fclose($p);
                }
            }
            proc_close($this->proc);
        }
    }
}

/**
 * A web server that does not serve raftlock's calls (tests/unserved.php):
 * it answers every call with one status and body, and counts them.
 */
final class Unserving
{
    private $proc;
    private string $log;
    public int $port;

    public function __construct(int $status, string $type, string $body)
    {
        $this->port = Cluster::freeBase(1);
        $this->log = (string) tempnam(sys_get_temp_dir(), 'raftlock-php-unserved-');
        $env = ['UNSERVED_STATUS' => (string) $status, 'UNSERVED_TYPE' => $type, 'UNSERVED_BODY' => $body, 'UNSERVED_LOG' => $this->log] + getenv();
        $this->proc = proc_open([\PHP_BINARY, '-S', "127.0.0.1:$this->port", __DIR__.'/unserved.php'], [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'a'], 2 => ['file', '/dev/null', 'a']], $pipes, null, $env);
        $ready = fn () => 'ready' === @file_get_contents("http://127.0.0.1:$this->port/ready", false, stream_context_create(['http' => ['timeout' => 5]]));
        eventually(15, 'the stand-in web server up', $ready);
    }

    public function endpoint(): string
    {
        return "http://127.0.0.1:$this->port";
    }

    /** How many calls it was asked. */
    public function asked(): int
    {
        clearstatcache();

        return substr_count((string) file_get_contents($this->log), "\n");
    }

    public function __destruct()
    {
        if (\is_resource($this->proc)) {
            proc_terminate($this->proc, 9);
            proc_close($this->proc);
        }
        @unlink($this->log);
    }
}
