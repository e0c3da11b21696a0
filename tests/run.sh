#!/bin/sh
# Runs each test binary given under a deadline (DT_TEST_TIMEOUT seconds, default 600),
# prints its last line ("N passed, N failed"), and a total. Fails if any binary exits
# non-zero, dies on a signal or runs past its deadline. DT_TEST_RUNNER, when set, is a
# command each binary runs under (an emulator: qemu-aarch64 for make test-arm64).
# DT_TEST_BESIDE names binaries (paths under tests/, as comm/test_liveness) that spend
# their time waiting (on liveness bounds, timeouts, sleeps) rather than computing: they
# run one after another in a second lane beside the others, whose cores they leave free.
limit=${DT_TEST_TIMEOUT:-600}
total_pass=0 total_fail=0 bad=""

# run_all BINARY...: runs them in turn, adding to total_pass, total_fail and bad.
run_all() {
    for t in "$@"; do
        [ -x "$t" ] || continue
        start=$(date +%s.%N)
        # shellcheck disable=SC2086
        out=$(timeout -k 5 "$limit" ${DT_TEST_RUNNER:-} "$t" 2>"$t.stderr")
        rc=$?
        secs=$(echo "$(date +%s.%N) - $start" | bc)
        line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
        p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); p=${p:-0}
        f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p'); f=${f:-0}
        total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
        name=${t#build/}
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            printf '%-48s TIMEOUT after %ss\n' "$name" "$limit"; bad="$bad $name"
            tail -20 "$t.stderr"
        elif [ $rc -ne 0 ] || [ -z "$line" ]; then
            printf '%-48s FAILED (exit %s) %s\n' "$name" "$rc" "$line"; bad="$bad $name"
            tail -40 "$t.stderr"
            # The failed checks themselves, which a long dump above may have pushed out.
            echo "---- failed checks of $name:"
            grep -A2 '^FAIL .*:[0-9]* \[' "$t.stderr" | head -40
        else
            printf '%-48s %s  (%.1fs)\n' "$name" "$line" "$secs"
        fi
    done
}

main="" beside=""
for t in "$@"; do
    case " ${DT_TEST_BESIDE:-} " in
    *" ${t#*/tests/} "*) beside="$beside $t" ;;
    *) main="$main $t" ;;
    esac
done
lane=""
if [ -n "$beside" ]; then
    lane=$(mktemp)
    # shellcheck disable=SC2086
    (run_all $beside; echo "$total_pass $total_fail$bad" >"$lane") &
fi
# shellcheck disable=SC2086
run_all $main
if [ -n "$lane" ]; then
    wait
    read -r p f more <"$lane" || { p=0 f=0 more="(the second lane's results)"; }
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); bad="$bad${more:+ $more}"
    rm -f "$lane"
fi
echo "total: $total_pass passed, $total_fail failed"
if [ -n "$bad" ]; then
    echo "failing test binaries:$bad"
    exit 1
fi
