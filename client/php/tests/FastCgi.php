<?php

// A PHP-FPM pool for the suite, and a FastCGI client just big enough to
// send it one GET request and read its output as it comes.

declare(strict_types=1);

namespace Raftlock\Tests;

final class Fpm
{
    private $proc;
    private string $dir;
    public int $port;

    /** The php-fpm binary, or null if none is installed. */
    public static function binary(): ?string
    {
        $found = glob('/usr/sbin/php-fpm*') ?: [];
        sort($found);

        return $found[0] ?? null;
    }

    /** Starts a pool of one worker on a free loopback port. */
    public function __construct(string $binary)
    {
        $this->port = Cluster::freeBase(1);
        $this->dir = sys_get_temp_dir().'/raftlock-php-fpm-'.bin2hex(random_bytes(4));
        mkdir($this->dir);
        $user = posix_getpwuid(posix_geteuid())['name'] ?? 'root';
        $group = posix_getgrgid(posix_getegid())['name'] ?? 'root';
        file_put_contents("$this->dir/fpm.conf", implode("\n", [
            '[global]',
            "error_log = $this->dir/fpm.log",
            "pid = $this->dir/fpm.pid",
            'daemonize = no',
            '[test]',
            "user = $user",
            "group = $group",
            "listen = 127.0.0.1:$this->port",
            'pm = static',
            'pm.max_children = 1',
            'php_admin_value[output_buffering] = 0',
            'catch_workers_output = yes',
            '',
        ]));
        $args = [$binary, '--nodaemonize', '--fpm-config', "$this->dir/fpm.conf"];
        if (0 === posix_geteuid()) {
            $args[] = '--allow-to-run-as-root';
        }
        $this->proc = proc_open($args, [0 => ['file', '/dev/null', 'r'], 1 => ['file', "$this->dir/out.log", 'a'], 2 => ['file', "$this->dir/out.log", 'a']], $pipes);
        eventually(10, 'php-fpm listening', function () {
            $s = @stream_socket_client("tcp://127.0.0.1:$this->port", $errno, $error, 1);
            if (false === $s) {
                return false;
            }
            fclose($s);

            return true;
        });
    }

    /** What php-fpm logged, for a failure message. */
    public function log(): string
    {
        return (@file_get_contents("$this->dir/fpm.log") ?: '').(@file_get_contents("$this->dir/out.log") ?: '');
    }

    /** Stops the pool, its workers with it (a worker outlives a killed master). */
    public function stop(): void
    {
        if (\is_resource($this->proc)) {
            $master = proc_get_status($this->proc)['pid'];
            $workers = array_filter(array_map('intval', preg_split('/\s+/', (string) @file_get_contents("/proc/$master/task/$master/children"))));
            // SIGTERM: php-fpm stops its workers and exits.
            posix_kill($master, 15);
            $deadline = microtime(true) + 10;
            while (proc_get_status($this->proc)['running'] && microtime(true) < $deadline) {
                usleep(20000);
            }
            proc_terminate($this->proc, 9);
            proc_close($this->proc);
            foreach ($workers as $pid) {
                @posix_kill($pid, 9);
            }
        }
        foreach (glob("$this->dir/*") ?: [] as $f) {
            unlink($f);
        }
        @rmdir($this->dir);
    }

    /**
     * Sends GET $script?$query to the pool (with $server added to the
     * request's $_SERVER) and returns the connection, to read the output
     * from with readLine().
     *
     * @param array<string, string> $server
     * @return resource
     */
    public function get(string $script, string $query, array $server)
    {
        $s = stream_socket_client("tcp://127.0.0.1:$this->port", $errno, $error, 5);
        if (false === $s) {
            throw new TestFailure("cannot reach php-fpm: $error");
        }
        $params = [
            'GATEWAY_INTERFACE' => 'FastCGI/1.0',
            'REQUEST_METHOD' => 'GET',
            'SCRIPT_FILENAME' => $script,
            'SCRIPT_NAME' => '/'.basename($script),
            'QUERY_STRING' => $query,
            'SERVER_PROTOCOL' => 'HTTP/1.1',
            'SERVER_NAME' => 'localhost',
            'REMOTE_ADDR' => '127.0.0.1',
        ] + $server;
        $body = '';
        foreach ($params as $k => $v) {
            $body .= self::length(\strlen($k)).self::length(\strlen($v)).$k.$v;
        }
        // BEGIN_REQUEST (role responder, keep no connection), PARAMS, the
        // end of PARAMS, the end of STDIN.
        fwrite($s, self::record(1, pack('nCx5', 1, 0)).self::record(4, $body).self::record(4, '').self::record(5, ''));
        $this->buffers[(int) $s] = '';

        return $s;
    }

    /** @var array<int, string> */
    private array $buffers = [];

    /**
     * The next line of the response's output (headers included), within
     * $within seconds; null if the response ended first.
     *
     * @param resource $s
     */
    public function readLine($s, float $within): ?string
    {
        $deadline = microtime(true) + $within;
        $out = &$this->buffers[(int) $s];
        while (false === ($nl = strpos($out, "\n"))) {
            $left = $deadline - microtime(true);
            if ($left <= 0) {
                throw new TestFailure("no output from php-fpm within $within s; its log: ".$this->log());
            }
            stream_set_timeout($s, (int) ceil($left));
            $head = fread($s, 8);
            if (false === $head || \strlen($head) < 8) {
                return null;
            }
            $h = unpack('Cversion/Ctype/nid/nlength/Cpadding', $head);
            $content = '';
            while (\strlen($content) < $h['length'] + $h['padding']) {
                $more = fread($s, $h['length'] + $h['padding'] - \strlen($content));
                if (false === $more || '' === $more) {
                    return null;
                }
                $content .= $more;
            }
            if (6 === $h['type']) { // STDOUT
                $out .= substr($content, 0, $h['length']);
            } elseif (3 === $h['type']) { // END_REQUEST
                return null;
            }
        }
        $line = substr($out, 0, $nl);
        $out = substr($out, $nl + 1);

        return rtrim($line, "\r");
    }

    private static function record(int $type, string $content): string
    {
        return pack('CCnnCx', 1, $type, 1, \strlen($content), 0).$content;
    }

    private static function length(int $n): string
    {
        return $n < 128 ? \chr($n) : pack('N', $n | 0x80000000);
    }
}
