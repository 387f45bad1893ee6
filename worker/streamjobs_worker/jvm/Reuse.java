package streamjobs.jvm;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.catalyst.expressions.CurrentDate;
import org.apache.spark.sql.catalyst.expressions.CurrentTime;
import org.apache.spark.sql.catalyst.expressions.CurrentTimestampLike;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.LocalTimestamp;
import org.apache.spark.sql.catalyst.expressions.LocalTimestampNanos;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.execution.LocalTableScanExec;
import org.apache.spark.sql.execution.RangeExec;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.datasources.v2.BatchScanExec;
import org.apache.spark.sql.execution.exchange.Exchange;
import org.apache.spark.sql.execution.exchange.ReusedExchangeExec;

import scala.runtime.BoxedUnit;

/**
 * Whether a query planned over current-batch relations may run again on the next batch and give what
 * planning it anew would.
 *
 * Not when its physical plan keeps a result of its first run (an exchange's shuffle output or broadcast, a
 * subquery's value), reads anything but current-batch relations and literal rows (a file or cache would
 * be read as listed at planning), or its analyzed plan holds what the optimizer fixes once per planning
 * (the current time, date) or what differs per run by design (rand(), uuid(): a fresh seed per planning).
 */
public final class Reuse {
    private Reuse() {}

    /** Why the query's plan may not run again; null when it may. */
    public static String whyNot(Dataset<?> query) {
        StringBuilder why = new StringBuilder();
        LogicalPlan analyzed = query.queryExecution().analyzed();
        analyzed.foreach(node -> {
            node.expressions().foreach(root -> {
                root.foreach(e -> {
                    if (why.isEmpty()) {
                        why.append(expressionReason(e));
                    }
                    return BoxedUnit.UNIT;
                });
                return BoxedUnit.UNIT;
            });
            return BoxedUnit.UNIT;
        });
        SparkPlan executed = query.queryExecution().executedPlan();
        executed.foreach(node -> {
            if (why.isEmpty()) {
                why.append(nodeReason(node));
            }
            return BoxedUnit.UNIT;
        });
        return why.isEmpty() ? null : why.toString();
    }

    private static String expressionReason(Expression e) {
        if (e instanceof CurrentTimestampLike || e instanceof CurrentDate || e instanceof CurrentTime
                || e instanceof LocalTimestamp || e instanceof LocalTimestampNanos) {
            return e.prettyName() + " is fixed when a query is planned";
        }
        if (!e.deterministic() && e.children().forall(c -> c.deterministic())) {
            return e.prettyName() + " is not deterministic";
        }
        return "";
    }

    private static String nodeReason(SparkPlan node) {
        if (node instanceof Exchange || node instanceof ReusedExchangeExec) {
            return node.nodeName() + " keeps its first run's output";
        }
        if (!node.subqueries().isEmpty()) {
            return "a subquery keeps its first run's value";
        }
        if (node.children().isEmpty()) {
            boolean ours = node instanceof BatchScanExec scan && scan.scan() instanceof CurrentBatch.SlotScan;
            if (!ours && !(node instanceof LocalTableScanExec) && !(node instanceof RangeExec)) {
                return node.nodeName() + " reads what was there when the query was planned";
            }
        }
        return "";
    }
}
