<?php

// One lock holder of the PHP client for scripts/soak-clients.sh (PHP has
// no threads: the script starts a process per holder).
//
//   php holder.php ENDPOINTS NAME DURATION_S
//
// A Raftlock\Client at its defaults (grace 750 ms, retry timeout 15 s)
// takes NAME with a ttl of 30 s (the ttl must be given; 30 s is the
// README's usual) and holds it for DURATION_S seconds. Every 100 ms it
// reads state() (the count as it stands, sending nothing: this is the
// figure the jeopardy tally uses), then calls isHeld(), the check the
// README asks for before an action: it renews the session on the
// process's stream and waits for the answer, and so also pumps the stream
// (state() alone would not: PHP renews only inside calls into the client).
// A poll that finds the lock not held (and not lost) starts a jeopardy
// episode, the next that finds it held ends it. Prints an event line on
// stderr as it happens and one RESULT line on stdout at the end.

declare(strict_types=1);

require __DIR__.'/../../client/php/autoload.php';

use Raftlock\Client;

[, $endpoints, $name, $duration] = $argv;
$duration = (float) $duration;
const POLL_US = 100000;

function logLine(string $text): void
{
    $now = microtime(true);
    fwrite(\STDERR, gmdate('H:i:s', (int) $now).sprintf('.%03d ', (int) (fmod($now, 1) * 1000)).$text."\n");
}

function now(): float
{
    return hrtime(true) / 1e9;
}

$lost = false;
$episodes = 0;
$total = 0.0;
$longest = 0.0;
$since = null; // start of the jeopardy episode under way

$end = static function (float $now) use (&$since, &$total, &$longest): float {
    if (null === $since) {
        return 0.0;
    }
    $d = $now - $since;
    $total += $d;
    $longest = max($longest, $d);
    $since = null;

    return $d;
};
$observe = static function (string $state, ?float $now = null) use (&$lost, &$since, &$episodes, $end, $name): void {
    $now ??= now();
    if ('lost' === $state && !$lost) {
        $lost = true;
        $end($now);
        logLine("$name LOST");
    } elseif ('lost' === $state) {
    } elseif ('held' !== $state && null === $since) {
        $since = $now;
        ++$episodes;
        logLine(sprintf('%s %s (the count ran out %.3f s ago)', $name, $state, now() - $now));
    } elseif ('held' === $state && null !== $since) {
        logLine(sprintf('%s held again after %.3f s', $name, $end($now)));
    }
};
$result = static function (bool $held, string $error) use (&$lost, &$episodes, &$total, &$longest, $name): void {
    printf("RESULT client=php name=%s lost=%d on_lost=0 jeopardy=%d jeopardy_total=%.3f jeopardy_longest=%.3f held_at_end=%d error=%s\n",
        $name, (int) $lost, $episodes, $total, $longest, (int) $held, json_encode($error));
};

try {
    $client = new Client($endpoints);
    $r = $client->lock($name, 30000, 20000);
    if (!$r['acquired']) {
        $result(false, 'not acquired within 20 s');
        exit(0);
    }
    $s = $r['session_id'];
    // One poll: the count as it stands, then the README's check (which
    // renews, pumps the stream, and waits for the answer). The count may
    // run out while isHeld() waits: then the lock was in jeopardy from
    // that moment (heldFor() says when, sending nothing) until isHeld()
    // answered.
    $poll = static function () use ($client, $s, $observe): void {
        usleep(POLL_US);
        $observe($client->state($s));
        $until = now() + $client->heldFor($s);
        $held = $client->isHeld($s);
        $at = now();
        if ($at > $until) {
            $observe('jeopardy', $until);
        }
        $observe($held ? 'held' : $client->state($s), $at);
    };
    $stop = now() + $duration;
    while (now() < $stop) {
        $poll();
    }
    // Held at the end: held by the client's count (a jeopardy episode under
    // way may end within 5 s) and the fence current on the cluster.
    for ($wait = now() + 5; null !== $since && !$lost && now() < $wait;) {
        $poll();
    }
    $state = $client->state($s);
    $observe($state);
    $end(now());
    $current = $client->checkFence($name, $r['fence']);
    $client->unlock($s);
    $result('held' === $state && $current, $current ? '' : 'the cluster says the fence is not current');
} catch (Throwable $e) {
    $end(now());
    $result(false, get_class($e).': '.$e->getMessage());
}
