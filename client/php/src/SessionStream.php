<?php

declare(strict_types=1);

namespace Raftlock;

/**
 * The lease counts of this process's sessions on one cluster, and the one
 * KeepAlive stream (HTTP/1.1, newline-delimited JSON, a chunked upload left
 * open in a curl multi handle) that renews them, shared by every Client of
 * the process with the same endpoints, token and curl settings.
 *
 * PHP has no thread to renew in the background: every transfer a Client
 * makes runs in the same curl multi handle, and while it runs (and before
 * it starts) the stream sends the renewals that are due and reads their
 * answers. Between calls into the client nothing is sent, but the
 * stream's connection stays open; when the process dies, the kernel
 * closes it and the leader ends the sessions it carried a grace later.
 *
 * @internal used by Client; its methods may change
 */
final class SessionStream
{
    /** The part of a lease length the count leaves out (from the send time). */
    public const MARGIN = 0.1;
    /**
     * An ask unanswered for its session's grace (at most a third of its
     * ttl), or this long (seconds) if longer, leaves the stream's node: a
     * new stream is opened to the next node, and the old one is closed
     * once a newer one has renewed (the Go and Python clients' rule).
     */
    private const MIN_STUCK = 1.0;

    /** @var array<string, self> one per cluster key */
    private static array $all = [];
    private static ?\CurlMultiHandle $multi = null;
    /** @var array<int, int> spl_object_id of a finished transfer => its CURLcode */
    private static array $finished = [];
    /** @var array<int, true> spl_object_id of each transfer in the multi handle now */
    private static array $attached = [];

    /**
     * @var array<int, array{ttl: int, grace: int, held: float, alive: float, renewUntil: float, sent: float, carried: bool, lost: string|null, credited: bool}>
     *      session id => its count: held (the lease count: held before it), alive (the ttl count: lost from it),
     *      renewUntil (the stream renews it until then), sent (its last ask), carried (renewed on the stream open now),
     *      credited (a lease-starting answer for it was read in this process)
     */
    private array $sessions = [];
    /** @var array<int, array{0: int, 1: float, 2: int}> ask id => session, send time, ttl at the send (on the stream open now) */
    private array $asks = [];
    /** @var array<int, bool> ask id => whether it was answered expired (for the asks a caller waits for) */
    private array $answers = [];
    private int $askId = 0;

    private ?\CurlHandle $handle = null;
    /** A stream left for a new one (its node stopped answering), still open until the new one renews. */
    private ?\CurlHandle $stale = null;
    private string $staleTarget = '';
    private string $target = '';
    private string $out = '';
    private string $in = '';
    private bool $paused = false;
    private int $status = 0;
    private string $leaderHeader = '';
    private ?string $leader = null;
    private ?string $hint = null;
    private int $next = 0;
    private float $retryAt = 0.0;
    private float $backoff = Client::INITIAL_BACKOFF;
    /** Why the last stream ended, for an error message. */
    private string $lastError = '';

    /**
     * @param list<string>       $endpoints
     * @param array<int, mixed>  $curlOptions
     */
    private function __construct(private array $endpoints, private ?string $token, private array $curlOptions, private float $connectTimeout)
    {
    }

    /**
     * The stream and counts of the cluster these settings reach.
     *
     * @param list<string>      $endpoints
     * @param array<int, mixed> $curlOptions
     */
    public static function of(array $endpoints, ?string $token, array $curlOptions, float $connectTimeout): self
    {
        // The stream takes the connection's settings (TLS, addresses), not
        // a request's: no callbacks, no time limits.
        $curlOptions = array_filter($curlOptions, static fn ($v, $k) => !\is_object($v) && !\is_callable($v)
            && !\in_array($k, [\CURLOPT_TIMEOUT, \CURLOPT_TIMEOUT_MS, \CURLOPT_NOPROGRESS, \CURLOPT_LOW_SPEED_LIMIT, \CURLOPT_LOW_SPEED_TIME], true), \ARRAY_FILTER_USE_BOTH);
        $key = md5(serialize([$endpoints, $token, $curlOptions]));

        return self::$all[$key] ??= new self($endpoints, $token, $curlOptions, $connectTimeout);
    }

    public static function now(): float
    {
        return hrtime(true) / 1e9;
    }

    private static function multi(): \CurlMultiHandle
    {
        return self::$multi ??= curl_multi_init();
    }

    /**
     * Runs the transfer $h to its end in the process's multi handle,
     * renewing the process's sessions meanwhile; its CURLcode.
     */
    public static function run(\CurlHandle $h): int
    {
        $m = self::multi();
        $id = spl_object_id($h);
        unset(self::$finished[$id]);
        self::attach($h);
        try {
            while (true) {
                self::pumpAll();
                if (isset(self::$finished[$id])) {
                    return self::$finished[$id];
                }
                self::wait(0.05);
            }
        } finally {
            unset(self::$finished[$id]);
            self::detach($h);
        }
    }

    private static function attach(\CurlHandle $h): void
    {
        curl_multi_add_handle(self::multi(), $h);
        self::$attached[spl_object_id($h)] = true;
    }

    private static function detach(\CurlHandle $h): void
    {
        curl_multi_remove_handle(self::multi(), $h);
        unset(self::$attached[spl_object_id($h)]);
    }

    /**
     * Moves every transfer on, then every stream: reads the answers that
     * came, sends the renewals that are due, opens a stream again if it
     * broke. Sends nothing else and never waits.
     */
    public static function pumpAll(): void
    {
        self::perform();
        foreach (self::$all as $s) {
            $s->pump();
        }
        self::perform();
    }

    private static function perform(): void
    {
        $m = self::multi();
        do {
            $st = curl_multi_exec($m, $running);
        } while (\CURLM_CALL_MULTI_PERFORM === $st);
        while (false !== ($msg = curl_multi_info_read($m))) {
            self::$finished[spl_object_id($msg['handle'])] = (int) $msg['result'];
        }
    }

    /**
     * Waits for activity on a transfer, at most $most seconds and no later
     * than the next renewal due; with no transfer to wait on, sleeps that
     * long. curl_multi_select() returns at once when curl has no socket to
     * wait on: every transfer in the multi handle has finished, or is a
     * stream left for a new one whose peer closed it (its upload paused,
     * nothing left to read); then the rest of the time is slept, not spun.
     */
    private static function wait(float $most): void
    {
        $now = self::now();
        $until = $now + $most;
        foreach (self::$all as $s) {
            $until = min($until, $s->nextDue());
        }
        $for = max(0.001, $until - $now);
        $running = 0;
        foreach (self::$attached as $id => $_) {
            $running += isset(self::$finished[$id]) ? 0 : 1;
        }
        if ($running > 0 && curl_multi_select(self::multi(), $for) > 0) {
            return;
        }
        $left = $until - self::now();
        if ($left > 0.0005) {
            usleep((int) ($left * 1e6));
        }
    }

    // ---- the counts ----

    /** The lease length of a count (seconds): the ttl, or the grace if shorter. */
    private static function span(int $ttl, int $grace): float
    {
        return ($grace > 0 ? min($ttl, $grace) : $ttl) / 1000;
    }

    public function tracks(int $id): bool
    {
        return isset($this->sessions[$id]);
    }

    /** The ttl $id is counted with (ms; 0: not counted). */
    public function ttl(int $id): int
    {
        return $this->sessions[$id]['ttl'] ?? 0;
    }

    /** The grace $id was opened with (ms; 0: none). */
    public function grace(int $id): int
    {
        return $this->sessions[$id]['grace'] ?? 0;
    }

    /**
     * Counts session $id (opened with $ttl and $grace ms) from a
     * lease-starting answer, received now, to a request sent at $sent, or
     * from nothing ($sent null: not held until a renewal is answered).
     * The lease count (held) runs from the send; the ttl count (lost past
     * it, which only decides when to give up) from now, the receipt: a
     * grant that waited long in a queue gets a whole ttl.
     */
    public function add(int $id, int $ttl, int $grace, ?float $sent, ?string $leader): void
    {
        $now = self::now();
        $this->sessions[$id] = [
            'ttl' => $ttl,
            'grace' => $grace,
            'held' => null === $sent ? 0.0 : $sent + self::span($ttl, $grace) * (1 - self::MARGIN),
            'alive' => $now + $ttl / 1000 * (1 - self::MARGIN),
            'renewUntil' => $now + $ttl / 1000,
            'sent' => $sent ?? 0.0,
            'carried' => false,
            'lost' => null,
            'credited' => null !== $sent,
        ];
        if (null !== $leader && null === $this->handle) {
            $this->leader = $leader;
        }
    }

    /** Stops counting $id (released: belief ends at the release's send). */
    public function remove(int $id): void
    {
        unset($this->sessions[$id]);
    }

    /** The application used $id: the stream renews it for another ttl from now. */
    public function touch(int $id): void
    {
        if (isset($this->sessions[$id])) {
            $s = &$this->sessions[$id];
            $s['renewUntil'] = max($s['renewUntil'], self::now() + $s['ttl'] / 1000);
        }
    }

    /**
     * Credits a lease-starting answer, received now, to a request for $id
     * sent at $sent with $ttl in force: held for the lease length (less the
     * margin) from $sent, and a new ttl count from now. Unless the ttl
     * count had already run out (the same rule as state(), so that whether
     * it is lost does not depend on which of the two runs first): then it
     * is lost, for good.
     */
    public function credit(int $id, float $sent, ?int $ttl = null): void
    {
        if (!isset($this->sessions[$id]) || 'lost' === $this->state($id)) {
            return;
        }
        $s = &$this->sessions[$id];
        $ttl = min($ttl ?? $s['ttl'], $s['ttl']);
        $s['held'] = max($s['held'], $sent + self::span($ttl, $s['grace']) * (1 - self::MARGIN));
        $s['alive'] = max($s['alive'], self::now() + $ttl / 1000 * (1 - self::MARGIN));
        $s['credited'] = true;
    }

    /** A grant in $id was answered now (it was alive): its ttl count starts again from now. */
    public function granted(int $id): void
    {
        if (isset($this->sessions[$id]) && 'lost' !== $this->state($id)) {
            $s = &$this->sessions[$id];
            $s['alive'] = max($s['alive'], self::now() + $s['ttl'] / 1000 * (1 - self::MARGIN));
        }
    }

    /** Whether a lease-starting answer for $id was read in this process (false for a session tracked from another). */
    public function credited(int $id): bool
    {
        return $this->sessions[$id]['credited'] ?? false;
    }

    /** A SetSessionTtl to $ttl is sent now: a shorter ttl cuts the counts at once. */
    public function ttlChangeSent(int $id, float $sent, int $ttl): void
    {
        if (!isset($this->sessions[$id])) {
            return;
        }
        $s = &$this->sessions[$id];
        if ($ttl < $s['ttl']) {
            $s['ttl'] = $ttl;
            $s['held'] = min($s['held'], $sent + self::span($ttl, $s['grace']) * (1 - self::MARGIN));
            $s['alive'] = min($s['alive'], $sent + $ttl / 1000 * (1 - self::MARGIN));
        }
    }

    /** The SetSessionTtl to $ttl sent at $sent was answered. */
    public function ttlChanged(int $id, float $sent, int $ttl): void
    {
        if (isset($this->sessions[$id])) {
            $this->sessions[$id]['ttl'] = $ttl;
            $this->credit($id, $sent, $ttl);
        }
    }

    /** A node said session $id is gone: lost, for good. */
    public function lose(int $id, string $why): void
    {
        if (isset($this->sessions[$id]) && null === $this->sessions[$id]['lost']) {
            $this->sessions[$id]['lost'] = $why;
        }
    }

    /** "held", "jeopardy", "lost", or "unknown" (not counted here). Sends nothing. */
    public function state(int $id): string
    {
        if (!isset($this->sessions[$id])) {
            return 'unknown';
        }
        $s = &$this->sessions[$id];
        $now = self::now();
        if (null === $s['lost'] && $now >= $s['alive']) {
            $s['lost'] = 'no renewal answered within its ttl count';
        }
        if (null !== $s['lost']) {
            return 'lost';
        }

        return $now < $s['held'] ? 'held' : 'jeopardy';
    }

    /** Seconds the count still believes $id held (<= 0: not held). */
    public function heldFor(int $id): float
    {
        return 'held' === $this->state($id) ? $this->sessions[$id]['held'] - self::now() : 0.0;
    }

    /** The count's end (monotonic seconds) past which $id is lost. */
    public function aliveUntil(int $id): float
    {
        return $this->sessions[$id]['alive'] ?? 0.0;
    }

    // ---- the stream ----

    /** When the next renewal is due (monotonic seconds). */
    private function nextDue(): float
    {
        $due = \INF;
        foreach ($this->sessions as $s) {
            $due = min($due, $this->dueAt($s));
        }

        return $due;
    }

    /**
     * When session $s's next ask is due (monotonic seconds; INF: none):
     * at once if the stream open now does not carry it yet, else a third
     * of its lease length after its last ask, if that is before the end of
     * its renewal window; with no stream open, no sooner than the stream
     * may be opened again (else a wait would wake every millisecond until
     * then). The one rule for both pump() (which asks) and wait() (which
     * sleeps until then).
     *
     * @param array{ttl: int, grace: int, renewUntil: float, sent: float, carried: bool, lost: string|null} $s
     */
    private function dueAt(array $s): float
    {
        if (null !== $s['lost'] || $s['grace'] <= 0) {
            return \INF;
        }
        $at = 0.0;
        if ($s['carried']) {
            $at = $s['sent'] + self::span($s['ttl'], $s['grace']) / 3;
            if ($at >= $s['renewUntil']) {
                return \INF;
            }
        }

        return null === $this->handle ? max($at, $this->retryAt) : $at;
    }

    private function pump(): void
    {
        $this->read();
        $now = self::now();
        $due = [];
        $carries = false;
        foreach ($this->sessions as $id => $s) {
            if ($s['grace'] <= 0 || 'lost' === $this->state($id)) {
                continue;
            }
            $carries = true;
            if ($this->dueAt($s) <= $now) {
                $due[] = $id;
            }
        }
        if (!$carries && null !== $this->handle) {
            // Nothing left to carry: no connection left open either (a
            // node shutting down waits for its open streams).
            $this->idle();

            return;
        }
        if (!$due) {
            return;
        }
        if (null === $this->handle) {
            if ($now < $this->retryAt) {
                return;
            }
            $this->open();
        }
        foreach ($due as $id) {
            $this->ask($id);
        }
    }

    /**
     * Renews $id on the stream now and waits for the answer, opening the
     * stream again if it breaks, until $deadline (monotonic seconds).
     * True: renewed; false: the session is gone (lost).
     *
     * @throws RaftlockException UNAVAILABLE when no answer came by $deadline
     */
    public function renewNow(int $id, float $deadline): bool
    {
        while (true) {
            if ('lost' === $this->state($id)) {
                return false;
            }
            self::pumpAll();
            if (null === $this->handle && self::now() >= $this->retryAt) {
                $this->open();
            }
            if (null !== $this->handle) {
                $ask = $this->ask($id);
                while (isset($this->asks[$ask]) && self::now() < $deadline) {
                    self::wait(0.05);
                    self::pumpAll();
                }
                if (isset($this->answers[$ask])) {
                    $expired = $this->answers[$ask];
                    unset($this->answers[$ask]);

                    return !$expired;
                }
            }
            if (self::now() >= $deadline) {
                throw new RaftlockException('UNAVAILABLE', 'no leader answered a KeepAlive on the stream in time'.('' !== $this->lastError ? " ($this->lastError)" : ''));
            }
            if (null === $this->handle) {
                self::wait(max(0.001, min($this->retryAt, $deadline) - self::now()));
            }
        }
    }

    private function ask(int $id): int
    {
        $a = ++$this->askId;
        $now = self::now();
        $s = &$this->sessions[$id];
        $this->asks[$a] = [$id, $now, $s['ttl']];
        $s['sent'] = $now;
        $s['carried'] = true;
        $this->out .= json_encode(['session_id' => (string) $id, 'ask_id' => (string) $a])."\n";
        if ($this->paused) {
            $this->paused = false;
            curl_pause($this->handle, \CURLPAUSE_CONT);
        }

        return $a;
    }

    private function open(): void
    {
        $n = \count($this->endpoints);
        $this->target = $this->hint ?? $this->leader ?? $this->endpoints[$this->next++ % $n];
        $this->hint = null;
        $this->out = '';
        $this->in = '';
        $this->paused = false;
        $this->status = 0;
        $this->leaderHeader = '';
        $this->asks = [];
        foreach ($this->sessions as &$s) {
            $s['carried'] = false;
        }
        unset($s);
        $headers = ['Content-Type: application/x-ndjson', 'Transfer-Encoding: chunked', 'Expect:'];
        if (null !== $this->token) {
            $headers[] = 'Authorization: Bearer '.$this->token;
        }
        $h = curl_init();
        curl_setopt_array($h, [
            \CURLOPT_URL => $this->target.'/v1/locks/KeepAlive',
            \CURLOPT_POST => true,
            \CURLOPT_HTTPHEADER => $headers,
            \CURLOPT_HTTP_VERSION => \CURL_HTTP_VERSION_1_1,
            \CURLOPT_CONNECTTIMEOUT_MS => (int) ($this->connectTimeout * 1000),
            \CURLOPT_NOSIGNAL => true,
            \CURLOPT_PROXY => '',
            \CURLOPT_TCP_KEEPALIVE => 1,
            \CURLOPT_TCP_KEEPIDLE => 10,
            \CURLOPT_TCP_KEEPINTVL => 5,
            // The upload: the asks written so far, then a pause until the next.
            \CURLOPT_READFUNCTION => function ($ch, $fd, int $length) {
                if ($ch !== $this->handle || '' === $this->out) {
                    // Nothing to send (a stream left for a new one sends
                    // nothing more).
                    if ($ch === $this->handle) {
                        $this->paused = true;
                    }

                    return \CURL_READFUNC_PAUSE;
                }
                $chunk = substr($this->out, 0, $length);
                $this->out = substr($this->out, \strlen($chunk));

                return $chunk;
            },
            \CURLOPT_WRITEFUNCTION => function ($ch, string $data): int {
                if ($ch === $this->handle) {
                    $this->in .= $data;
                }

                return \strlen($data);
            },
            \CURLOPT_HEADERFUNCTION => function ($ch, string $line): int {
                if ($ch !== $this->handle) {
                    return \strlen($line);
                }
                if (preg_match('#^HTTP/\S+ (\d+)#', $line, $m)) {
                    $this->status = (int) $m[1];
                } elseif (0 === stripos($line, 'raftlock-leader:')) {
                    $this->leaderHeader = trim(substr($line, \strlen('raftlock-leader:')));
                }

                return \strlen($line);
            },
        ] + $this->curlOptions);
        $this->handle = $h;
        self::attach($h);
    }

    /** Reads the answers that came; ends the stream if it failed. */
    private function read(): void
    {
        if (null !== $this->stale && isset(self::$finished[spl_object_id($this->stale)])) {
            // The stream left for a new one ended by itself (its node
            // closed it): nothing is kept open by keeping it.
            $this->dropStale();
        }
        if (null === $this->handle) {
            return;
        }
        if (0 !== $this->status && 200 !== $this->status) {
            // Refused as a whole (an error object, not a stream).
            $e = json_decode($this->in, true);
            $this->close("HTTP $this->status: ".trim($this->in), '' !== $this->leaderHeader ? $this->leaderHeader : (string) ($e['leader'] ?? ''));

            return;
        }
        while (false !== ($nl = strpos($this->in, "\n"))) {
            $line = substr($this->in, 0, $nl);
            $this->in = substr($this->in, $nl + 1);
            $l = json_decode($line, true);
            if (!\is_array($l)) {
                $this->close('not JSON: '.$line, '');

                return;
            }
            if (isset($l['code'])) {
                $this->close($l['code'].': '.($l['message'] ?? ''), (string) ($l['leader'] ?? ''));

                return;
            }
            $a = (int) ($l['ask_id'] ?? 0);
            if (!isset($this->asks[$a])) {
                continue;
            }
            [$id, $sent, $ttl] = $this->asks[$a];
            unset($this->asks[$a]);
            if ((int) ($l['session_id'] ?? 0) !== $id) {
                // Not the answer to that ask: never credit it.
                continue;
            }
            $expired = (bool) ($l['expired'] ?? false);
            $this->answers[$a] = $expired;
            if ($expired) {
                $this->lose($id, 'the node answered that its session ended');
            } else {
                $this->credit($id, $sent, $ttl);
                $this->leader = $this->target;
                $this->backoff = Client::INITIAL_BACKOFF;
                // This stream renews: the one it replaced may close now.
                $this->dropStale();
            }
        }
        $done = self::$finished[spl_object_id($this->handle)] ?? null;
        if (null !== $done) {
            $this->close('the stream ended ('.(curl_strerror($done) ?? "curl error $done").')', '');

            return;
        }
        foreach ($this->asks as [$id, $sent]) {
            $s = $this->sessions[$id] ?? ['grace' => 0, 'ttl' => 0];
            $stuck = max(min($s['grace'], $s['ttl'] / 3) / 1000, self::MIN_STUCK);
            if (self::now() - $sent > $stuck) {
                $this->replace(sprintf('an ask unanswered for %.2f s', $stuck));

                return;
            }
            break; // the oldest
        }
        // Forget the answers nobody waits for any more.
        if (\count($this->answers) > 64) {
            $this->answers = \array_slice($this->answers, -64, null, true);
        }
    }

    /**
     * Leaves the stream's node (it stopped answering): opens a new stream
     * to the next node at once, and keeps the old one open (sending
     * nothing more on it) until a newer one renews, since the leader ends a
     * session a grace after the last stream that renews it closes. If an
     * older stream left this way is still open (nothing renewed since), it
     * is the one kept (it carried the sessions), and this newer one is
     * closed.
     */
    private function replace(string $why): void
    {
        if (null === $this->stale) {
            $this->stale = $this->handle;
            $this->staleTarget = $this->target;
        } else {
            $h = $this->handle;
            unset(self::$finished[spl_object_id($h)]);
            self::detach($h);
            curl_close($h);
        }
        $this->handle = null;
        $this->lastError = "$this->target: $why";
        $this->leader = null;
        $n = \count($this->endpoints);
        $next = $this->endpoints[$this->next++ % $n];
        if ($next === $this->staleTarget && $n > 1) {
            $next = $this->endpoints[$this->next++ % $n];
        }
        $this->hint = $next;
        $this->open();
    }

    /** Closes the stream a new one replaced, if any. */
    private function dropStale(): void
    {
        if (null !== $this->stale) {
            $h = $this->stale;
            $this->stale = null;
            unset(self::$finished[spl_object_id($h)]);
            self::detach($h);
            curl_close($h);
        }
    }

    /** Ends a stream that carries nothing; the next session opens another. */
    private function idle(): void
    {
        $this->dropStale();
        $h = $this->handle;
        $this->handle = null;
        unset(self::$finished[spl_object_id($h)]);
        self::detach($h);
        $this->asks = [];
        $this->leader = $this->target;
    }

    /** Ends the stream (its connection closes); the next pump opens another, at once to a named leader. */
    private function close(string $why, string $leader): void
    {
        $h = $this->handle;
        $this->handle = null;
        unset(self::$finished[spl_object_id($h)]);
        self::detach($h);
        curl_close($h);
        $this->lastError = "$this->target: $why";
        $this->asks = [];
        // A hint naming the node this stream left for not answering is not
        // followed (it may still think it leads): the next node is tried.
        if ('' !== $leader && $this->target !== self::schemeOf($this->target).'://'.$leader
            && (null === $this->stale || $this->staleTarget !== self::schemeOf($this->target).'://'.$leader)) {
            $this->hint = self::schemeOf($this->target).'://'.$leader;
            $this->retryAt = 0.0;
        } else {
            $this->leader = null;
            $this->retryAt = self::now() + $this->backoff * (0.5 + mt_rand() / mt_getrandmax());
            $this->backoff = min(Client::MAX_BACKOFF, $this->backoff * 2);
        }
    }

    private static function schemeOf(string $base): string
    {
        return substr($base, 0, (int) strpos($base, '://'));
    }
}
