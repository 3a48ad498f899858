"""hardening: jobs.enqueued_at (the ingest outbox) and idempotency_keys

Revision ID: 0007_hardening
Revises: 0006_roles_previews
"""
import sqlalchemy as sa
from alembic import op

revision = '0007_hardening'
down_revision = '0006_roles_previews'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_enqueued_at'), ['enqueued_at'], unique=False)
    # Jobs from before the outbox were sent when admitted: the outbox pass must not send them again.
    op.execute("UPDATE jobs SET enqueued_at = admitted_at WHERE admitted_at IS NOT NULL")
    op.create_table(
        'idempotency_keys',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('station_id', sa.String(length=32), nullable=False),
        sa.Column('key', sa.String(length=255), nullable=False),
        sa.Column('scope', sa.String(length=100), nullable=False),
        sa.Column('fingerprint', sa.String(length=64), nullable=False),
        sa.Column('resource_id', sa.String(length=32), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['station_id'], ['stations.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('station_id', 'key'),
    )
    op.create_index(op.f('ix_idempotency_keys_created_at'), 'idempotency_keys', ['created_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_idempotency_keys_created_at'), table_name='idempotency_keys')
    op.drop_table('idempotency_keys')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_enqueued_at'))
        batch_op.drop_column('enqueued_at')
